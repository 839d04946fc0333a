package chaostest

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// RabbitMQMessages returns the messages of the named queues of the local
// RabbitMQ, ready or delivered and not acknowledged yet, as rabbitmqctl
// counts them (AMQP's passive declare counts only the ready ones). A
// queue that does not exist counts 0.
func RabbitMQMessages(t testing.TB, queues ...string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, "rabbitmqctl", "-q", "list_queues", "name", "messages").Output()
	if err != nil {
		t.Fatalf("rabbitmqctl list_queues: %v", err)
	}
	n := 0
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		for _, q := range queues {
			if f[0] == q {
				m, err := strconv.Atoi(f[1])
				if err != nil {
					t.Fatalf("rabbitmqctl list_queues: %q", line)
				}
				n += m
			}
		}
	}
	return n
}
