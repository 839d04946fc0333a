package consumertest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/consumertest"
	"github.com/idemgo/idem/internal/prooftest"
)

// queue is an in-memory broker: a queue of messages with a delivery count,
// and a dead-letter count. It outlives the consumers started on it.
type queue struct {
	mu    sync.Mutex
	msgs  []*msg
	dead  int
	ready chan struct{}
	// ackEarly is the deliberate bug of the negative control: the
	// consumer acknowledges a message when it receives it.
	ackEarly bool
}

type msg struct {
	key, payload string
	deliveries   int
}

func (q *queue) Publish(t *testing.T, key string, payload []byte) {
	q.push(&msg{key: key, payload: string(payload)})
}

func (q *queue) push(m *msg) {
	q.mu.Lock()
	q.msgs = append(q.msgs, m)
	q.mu.Unlock()
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *queue) pop() *msg {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.msgs) == 0 {
		return nil
	}
	m := q.msgs[0]
	q.msgs = q.msgs[1:]
	return m
}

func (q *queue) DeadLetters(t *testing.T) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.dead
}

// Start runs a consumer that takes one message at a time and maps the
// Processor's actions: Ack drops the message, Retry puts it back, and
// DeadLetter counts it.
func (q *queue) Start(t *testing.T, opts []consumer.Option, h consumertest.Handler) (func() consumer.Stats, func()) {
	p := prooftest.MemProcessor(t, time.Second, opts...)
	run := func(ctx context.Context) error {
		for ctx.Err() == nil {
			m := q.pop()
			if m == nil {
				select {
				case <-q.ready:
				case <-ctx.Done():
				}
				continue
			}
			m.deliveries++
			in := consumer.Message{Key: m.key, Fingerprint: m.payload, Deliveries: m.deliveries}
			r := p.Process(ctx, []consumer.Message{in}, func(ctx context.Context, _ int) error {
				return h(ctx, m.key, []byte(m.payload))
			})[0]
			if q.ackEarly {
				continue
			}
			switch r.Action {
			case consumer.Retry:
				q.push(m)
			case consumer.DeadLetter:
				q.mu.Lock()
				q.dead++
				q.mu.Unlock()
			}
		}
		return nil
	}
	return p.Stats, prooftest.Start(t, run)
}

// TestConformance runs the suite on the in-memory queue: a correct adapter
// passes it.
func TestConformance(t *testing.T) {
	consumertest.Run(t, func(t *testing.T) consumertest.Harness {
		return &queue{ready: make(chan struct{}, 1), ackEarly: os.Getenv("CONSUMERTEST_ACK_EARLY") != ""}
	})
}

// TestAckEarlyFails is the suite's negative control: an adapter that
// acknowledges a message when it receives it loses the message in flight at
// shutdown, and the suite says so.
func TestAckEarlyFails(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the suite in a child process")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestConformance$/^ShutdownFinishesOrReleasesInFlight$", "-test.v")
	cmd.Env = append(os.Environ(), "CONSUMERTEST_ACK_EARLY=1")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("the suite passed an adapter that acks early:\n%s", out)
	}
	if !strings.Contains(string(out), "else it is lost") {
		t.Fatalf("the suite failed for another reason:\n%s", out)
	}
}
