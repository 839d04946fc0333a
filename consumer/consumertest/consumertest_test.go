package consumertest_test

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/consumertest"
	"github.com/idemgo/idem/testkit/prooftest"
)

// queue is an in-memory broker: a queue of messages with a delivery count,
// and a dead-letter count. It outlives the consumers started on it.
type queue struct {
	mu    sync.Mutex
	msgs  []*msg
	dead  int
	ready chan struct{}
	// bug is the deliberate bug of a negative control: "ack-early" (the
	// consumer acknowledges a message when it receives it), "ack-retries"
	// (it acknowledges a message the Processor leaves for redelivery),
	// "handler-outside" (it runs the handler before the Processor acquires
	// the key), "ack-before-commit" (it acknowledges a handled message
	// before its key is completed), "uncancelled" (it processes messages
	// with a context that its stop does not cancel).
	bug  string
	exec *idem.Executor
}

func (q *queue) Executor(t *testing.T) *idem.Executor {
	if q.exec == nil {
		q.exec = prooftest.MemExecutor(t, idem.WithLease(time.Second))
	}
	return q.exec
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
	p, err := consumer.New(q.Executor(t), opts...)
	if err != nil {
		t.Fatal(err)
	}
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
			handler := func(ctx context.Context, _ int) error { return h(ctx, m.key, []byte(m.payload)) }
			if q.bug == "handler-outside" {
				err := h(ctx, m.key, []byte(m.payload))
				handler = func(context.Context, int) error { return err }
			}
			if q.bug == "ack-before-commit" {
				b := p.Acquire(ctx, []consumer.Message{in})
				b.Handle(handler)
				// acknowledged here, before the completion
				if r := b.Commit(ctx)[0]; r.Action == consumer.DeadLetter {
					q.mu.Lock()
					q.dead++
					q.mu.Unlock()
				}
				continue
			}
			pctx := ctx
			if q.bug == "uncancelled" {
				pctx = context.WithoutCancel(ctx)
			}
			r := p.Process(pctx, []consumer.Message{in}, handler)[0]
			if q.bug == "ack-early" {
				continue
			}
			switch r.Action {
			case consumer.Retry:
				if q.bug == "ack-retries" {
					continue
				}
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
		return &queue{ready: make(chan struct{}, 1), bug: os.Getenv("CONSUMERTEST_BUG")}
	})
}

// TestBuggyAdaptersFail is the suite's negative controls: each case fails
// an adapter with the bug it guards against, and says why.
func TestBuggyAdaptersFail(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the suite in a child process")
	}
	for _, tc := range []struct{ bug, test, want string }{
		// Acks a message when it receives it: the one in flight at
		// shutdown is lost.
		{"ack-early", "ShutdownFinishesOrReleasesInFlight", "else it is lost"},
		// Acks what the Processor leaves for redelivery: a duplicate in
		// progress elsewhere, a message whose lease was lost.
		{"ack-retries", "InProgressDuplicateNeverAcked", "an adapter that acked it loses it"},
		{"ack-retries", "LeaseLostNotAckedHookCalled", "an adapter that acked it loses it"},
		// Acks after the handler, before the completion: a completion that
		// fails (the lease was lost) loses the message.
		{"ack-before-commit", "LeaseLostNotAckedHookCalled", "an adapter that acked it loses it"},
		// Runs the handler before the key is acquired.
		{"handler-outside", "OrderAcquireHandlerComplete", "want one run with its key acquired"},
		// Processes with a context its stop does not cancel: a handler
		// that ignores its context keeps Run from returning.
		{"uncancelled", "StuckHandlerAbandonedAtShutdown", "a consumer that waits for the handler never returns"},
	} {
		t.Run(tc.bug+"/"+tc.test, func(t *testing.T) {
			t.Parallel() // each child waits out the suite's 20s timeout
			cmd := exec.Command(os.Args[0], "-test.run=^TestConformance$/^"+tc.test+"$", "-test.v")
			cmd.Env = append(os.Environ(), "CONSUMERTEST_BUG="+tc.bug)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("the suite passed an adapter with the bug %s:\n%s", tc.bug, out)
			}
			if !strings.Contains(string(out), tc.want) {
				t.Fatalf("the suite failed for another reason:\n%s", out)
			}
		})
	}
}
