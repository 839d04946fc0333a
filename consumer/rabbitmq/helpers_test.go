package rabbitmq

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	amqp "github.com/rabbitmq/amqp091-go"
)

// amqpURL is the broker the tests use: IDEM_AMQP_URL, or the local
// RabbitMQ. The tests fail (they do not skip) when it is unreachable.
func amqpURL() string {
	if u := os.Getenv("IDEM_AMQP_URL"); u != "" {
		return u
	}
	return "amqp://guest:guest@127.0.0.1:5672/"
}

// dial opens a connection for the test itself (publishing, inspecting
// queues), closed at cleanup.
func dial(t testing.TB) *amqp.Connection {
	t.Helper()
	conn, err := amqp.Dial(amqpURL())
	if err != nil {
		t.Fatalf("RabbitMQ at %s is unreachable: %v", amqpURL(), err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

var nonName = regexp.MustCompile(`[^a-zA-Z0-9]+`)

// testQueue returns a queue name unique to the test and deletes the queue,
// its retry queue and its dead-letter queue at cleanup.
func testQueue(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("idem-test-%s-%08x", strings.ToLower(nonName.ReplaceAllString(t.Name(), "-")), rand.Uint32())
	conn := dial(t)
	t.Cleanup(func() {
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("cleanup: %v", err)
			return
		}
		defer ch.Close()
		for _, q := range []string{name, name + ".retry", name + ".dlq"} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("cleanup: delete %s: %v", q, err)
				return
			}
		}
	})
	return name
}

// publisher publishes with confirms.
type publisher struct {
	t  testing.TB
	ch *amqp.Channel
	mu sync.Mutex
}

func newPublisher(t testing.TB, queue string) *publisher {
	t.Helper()
	conn := dial(t)
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	return newPublisherOn(t, ch)
}

// newPublisherOn makes a publisher on ch, a channel of the test's.
func newPublisherOn(t testing.TB, ch *amqp.Channel) *publisher {
	t.Helper()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	return &publisher{t: t, ch: ch}
}

// publish publishes msgs to queue and waits for their confirmations. It
// may be called from any goroutine.
func (p *publisher) publish(queue string, msgs ...amqp.Publishing) {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dcs := make([]*amqp.DeferredConfirmation, len(msgs))
	for i, m := range msgs {
		dc, err := p.ch.PublishWithDeferredConfirmWithContext(ctx, "", queue, false, false, m)
		if err != nil {
			p.t.Errorf("publish: %v", err)
			return
		}
		dcs[i] = dc
	}
	for _, dc := range dcs {
		if ok, err := dc.WaitContext(ctx); !ok || err != nil {
			p.t.Errorf("publish not confirmed: %v", err)
			return
		}
	}
}

func msg(key string, body string) amqp.Publishing {
	return amqp.Publishing{MessageId: key, Body: []byte(body), DeliveryMode: amqp.Persistent}
}

// depth returns the number of ready messages in queue.
func depth(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	var aerr *amqp.Error
	if errors.As(err, &aerr) && aerr.Code == amqp.NotFound {
		return 0 // not declared yet
	}
	if err != nil {
		t.Fatalf("inspect %s: %v", queue, err)
	}
	return q.Messages
}

// waitFor polls cond until it holds or the timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// sink is the side effect of the tests: it applies an effect per key only
// with a fence above the stored one, like
// UPDATE ... WHERE key = $1 AND fence < $2, and counts handler runs.
type sink struct {
	mu      sync.Mutex
	fence   map[string]int64
	applied map[string]int
	runs    map[string]int
	stale   int
}

func newSink() *sink {
	return &sink{fence: map[string]int64{}, applied: map[string]int{}, runs: map[string]int{}}
}

// run records a handler run for key and applies its effect with the
// context's fence; it reports whether the effect was applied.
func (s *sink) run(ctx context.Context, key string) bool {
	fence, ok := idem.FenceFrom(ctx)
	s.mu.Lock()
	s.runs[key]++
	s.mu.Unlock()
	if !ok {
		panic("handler context without a fence")
	}
	return s.apply(key, fence)
}

func (s *sink) apply(key string, fence int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if fence <= s.fence[key] {
		s.stale++
		return false
	}
	s.fence[key] = fence
	s.applied[key]++
	return true
}

func (s *sink) appliedCount(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied[key]
}

func (s *sink) runCount(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.runs[key]
}

func (s *sink) keys() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.applied)
}

// connKiller is an amqp.Config.Dial that remembers the connections it made,
// so that a test can cut them abruptly (as a network failure or a server
// that closes the socket would).
type connKiller struct {
	mu    sync.Mutex
	conns []net.Conn
}

func (k *connKiller) dial(network, addr string) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, 5*time.Second)
	if err != nil {
		return nil, err
	}
	k.mu.Lock()
	k.conns = append(k.conns, c)
	k.mu.Unlock()
	return c, nil
}

// kill closes every connection made so far.
func (k *connKiller) kill() {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, c := range k.conns {
		c.Close()
	}
	k.conns = nil
}

func (k *connKiller) config() amqp.Config {
	return amqp.Config{Heartbeat: 10 * time.Second, Locale: "en_US", Dial: k.dial}
}
