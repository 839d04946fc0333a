package sqsconsumer_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/consumer"
	sqsconsumer "github.com/idemgo/idem/consumer/sqs"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/prooftest"
	"github.com/idemgo/idem/testkit/sqsfake"
)

// waitFor polls cond every 20ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func drained(f *fakeSQS, queue string) func() bool {
	return func() bool {
		c := f.Counts(queue)
		return c.Visible == 0 && c.InFlight == 0 && c.Delayed == 0
	}
}

func TestNewValidation(t *testing.T) {
	f := startFake(t)
	client := f.client(nil)
	exec := prooftest.MemExecutor(t)
	h := func(context.Context, types.Message) error { return nil }
	tests := []struct {
		name   string
		client sqsconsumer.API
		q, dlq string
		exec   *idem.Executor
		h      sqsconsumer.Handler
		opts   []sqsconsumer.Option
	}{
		{name: "nil client", q: "q", dlq: "d", exec: exec, h: h},
		{name: "nil executor", client: client, q: "q", dlq: "d", h: h},
		{name: "nil handler", client: client, q: "q", dlq: "d", exec: exec},
		{name: "no queue", client: client, dlq: "d", exec: exec, h: h},
		{name: "no dead-letter queue", client: client, q: "q", exec: exec, h: h},
		{name: "dead-letter queue is the queue", client: client, q: "q", dlq: "q", exec: exec, h: h},
		{name: "batch 0", client: client, q: "q", dlq: "d", exec: exec, h: h, opts: []sqsconsumer.Option{consumer.WithBatchSize(0)}},
		{name: "batch 101", client: client, q: "q", dlq: "d", exec: exec, h: h, opts: []sqsconsumer.Option{consumer.WithBatchSize(101)}},
		{name: "concurrency 0", client: client, q: "q", dlq: "d", exec: exec, h: h, opts: []sqsconsumer.Option{consumer.WithConcurrency(0)}},
		{name: "visibility 1s", client: client, q: "q", dlq: "d", exec: exec, h: h, opts: []sqsconsumer.Option{sqsconsumer.WithVisibilityTimeout(time.Second)}},
		{name: "visibility 3.5s", client: client, q: "q", dlq: "d", exec: exec, h: h, opts: []sqsconsumer.Option{sqsconsumer.WithVisibilityTimeout(3500 * time.Millisecond)}},
		{name: "wait 21s", client: client, q: "q", dlq: "d", exec: exec, h: h, opts: []sqsconsumer.Option{sqsconsumer.WithWaitTime(21 * time.Second)}},
		{name: "max deliveries -1", client: client, q: "q", dlq: "d", exec: exec, h: h, opts: []sqsconsumer.Option{consumer.WithMaxDeliveries(-1)}},
		{name: "retry delay -1", client: client, q: "q", dlq: "d", exec: exec, h: h, opts: []sqsconsumer.Option{consumer.WithRetryDelay(-time.Second)}},
		{name: "nil key func", client: client, q: "q", dlq: "d", exec: exec, h: h, opts: []sqsconsumer.Option{sqsconsumer.WithKeyFunc(nil)}},
		{name: "empty scope", client: client, q: "q", dlq: "d", exec: exec, h: h, opts: []sqsconsumer.Option{consumer.WithScope("")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := sqsconsumer.New(tt.client, tt.q, tt.dlq, tt.exec, tt.h, tt.opts...)
			if !errors.Is(err, idem.ErrInvalid) || c != nil {
				t.Fatalf("got %v, %v; want an error wrapping idem.ErrInvalid", c, err)
			}
		})
	}
	if _, err := sqsconsumer.New(client, "q", "d", exec, h); err != nil {
		t.Fatalf("valid configuration: got %v, want nil", err)
	}
}

func TestKeyFuncs(t *testing.T) {
	attr := func(k, v string) map[string]types.MessageAttributeValue {
		return map[string]types.MessageAttributeValue{k: {DataType: aws.String("String"), StringValue: aws.String(v)}}
	}
	tests := []struct {
		name string
		f    sqsconsumer.KeyFunc
		m    types.Message
		want string
	}{
		{"dedup id first", sqsconsumer.DefaultKey, types.Message{Attributes: map[string]string{"MessageDeduplicationId": "d1"}, MessageAttributes: attr("idempotency-key", "k1")}, "d1"},
		{"attribute", sqsconsumer.DefaultKey, types.Message{MessageAttributes: attr("idempotency-key", "k1")}, "k1"},
		{"none", sqsconsumer.DefaultKey, types.Message{Body: aws.String("x")}, ""},
		{"named attribute", sqsconsumer.KeyHeader("order"), types.Message{MessageAttributes: attr("order", "o-7")}, "o-7"},
		{"body hash", sqsconsumer.KeyFromBodyHash(nil), types.Message{Body: aws.String("abc")}, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{"body part hash", sqsconsumer.KeyFromBodyHash(func(b string) string { return strings.Split(b, "|")[0] }), types.Message{Body: aws.String("abc|ts=1")}, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
		{"empty part", sqsconsumer.KeyFromBodyHash(func(string) string { return "" }), types.Message{Body: aws.String("abc")}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.f(tt.m); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

// TestConsume: duplicates are deleted without running the handler, a
// message without a key is dead-lettered, everything is deleted.
func TestConsume(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	qURL := f.CreateQueue("orders", sqsfake.QueueOptions{VisibilityTimeout: 30 * time.Second})
	dURL := f.CreateQueue("orders-dlq", sqsfake.QueueOptions{})
	exec := prooftest.MemExecutor(t)
	var mu sync.Mutex
	runs := map[string]int{}
	c, err := sqsconsumer.New(f.client(nil), qURL, dURL, exec, func(ctx context.Context, m types.Message) error {
		if _, ok := idem.FenceFrom(ctx); !ok {
			t.Error("handler context has no fence")
		}
		mu.Lock()
		runs[*m.Body]++
		mu.Unlock()
		return nil
	}, sqsconsumer.WithWaitTime(time.Second), consumer.WithBatchSize(25))
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"a", "b", "a", "c", "b", "a"} {
		f.Send("orders", k, keyAttr(k), "")
	}
	f.Send("orders", "keyless", nil, "")
	f.Send("orders", "fifo", nil, "dedup-1")
	f.Send("orders", "fifo", nil, "dedup-1")
	stop := runConsumer(t, c.Run)
	waitFor(t, 10*time.Second, "the queue to drain", drained(f, "orders"))
	stop()
	mu.Lock()
	defer mu.Unlock()
	for _, k := range []string{"a", "b", "c", "fifo"} {
		if runs[k] != 1 {
			t.Errorf("handler runs of %q: got %d, want 1", k, runs[k])
		}
	}
	if runs["keyless"] != 0 {
		t.Errorf("handler runs of the keyless message: got %d, want 0", runs["keyless"])
	}
	dl := f.Messages("orders-dlq")
	if len(dl) != 1 || dl[0].Body != "keyless" || !strings.Contains(dl[0].Attributes[sqsconsumer.AttrDeadLetterReason].StringValue, "no idempotency key") {
		t.Errorf("dead letters: got %+v, want the keyless message with its reason", dl)
	}
	got := c.Stats()
	want := sqsconsumer.Stats{Processed: 4, Replayed: 4, DeadLettered: 1, Invalid: 1}
	if got != want {
		t.Errorf("stats: got %+v, want %+v", got, want)
	}
}

// TestRetryThenDeadLetter: a failing handler releases the key, the message
// comes back after the retry delay, and after MaxDeliveries receives it is
// sent to the dead-letter queue and its key is FAILED.
func TestRetryThenDeadLetter(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	qURL := f.CreateQueue("q", sqsfake.QueueOptions{})
	dURL := f.CreateQueue("dlq", sqsfake.QueueOptions{})
	exec := prooftest.MemExecutor(t)
	var calls, flakyCalls atomic.Int32
	c, err := sqsconsumer.New(f.client(nil), qURL, dURL, exec, func(ctx context.Context, m types.Message) error {
		if *m.Body == "flaky" {
			if flakyCalls.Add(1) == 1 {
				return errors.New("downstream timeout")
			}
			return nil
		}
		calls.Add(1)
		return errors.New("always broken")
	}, sqsconsumer.WithWaitTime(time.Second), consumer.WithMaxDeliveries(3), consumer.WithRetryDelay(0))
	if err != nil {
		t.Fatal(err)
	}
	f.Send("q", "poison", keyAttr("p"), "")
	f.Send("q", "flaky", keyAttr("f"), "")
	stop := runConsumer(t, c.Run)
	waitFor(t, 10*time.Second, "the queue to drain", drained(f, "q"))
	stop()
	if got := calls.Load(); got != 3 {
		t.Errorf("handler calls of the poison message: got %d, want 3", got)
	}
	if got := flakyCalls.Load(); got != 2 {
		t.Errorf("handler calls of the flaky message: got %d, want 2", got)
	}
	if dl := f.Messages("dlq"); len(dl) != 1 || dl[0].Body != "poison" {
		t.Errorf("dead letters: got %+v, want the poison message", dl)
	}
	rec, err := adapterkit.Store(exec).Get(t.Context(), c.Processor().Key("p").Digest())
	if err != nil || rec.State != storekit.StateFailed {
		t.Errorf("record of the poison key: got %v, %v; want FAILED", rec.State, err)
	}
	if st := c.Stats(); st.Retried != 3 || st.DeadLettered != 1 || st.Processed != 1 {
		t.Errorf("stats: got %+v, want 3 retried, 1 dead-lettered, 1 processed", st)
	}
}

// TestInProgressDuplicate: a duplicate received by a second consumer while
// the first still runs the handler is not deleted; it comes back and is
// replayed once the first completed.
func TestInProgressDuplicate(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	qURL := f.CreateQueue("q", sqsfake.QueueOptions{})
	dURL := f.CreateQueue("dlq", sqsfake.QueueOptions{})
	exec := prooftest.MemExecutor(t, idem.WithLease(2*time.Second))
	started := make(chan struct{})
	release := make(chan struct{})
	var runs atomic.Int32
	h := func(ctx context.Context, m types.Message) error {
		if runs.Add(1) == 1 {
			close(started)
			<-release
		}
		return nil
	}
	opts := []sqsconsumer.Option{sqsconsumer.WithWaitTime(time.Second), consumer.WithBatchSize(1), sqsconsumer.WithVisibilityTimeout(3 * time.Second)}
	c1, err := sqsconsumer.New(f.client(nil), qURL, dURL, exec, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := sqsconsumer.New(f.client(nil), qURL, dURL, exec, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	f.Send("q", "one", keyAttr("k"), "")
	stop1 := runConsumer(t, c1.Run)
	<-started
	f.Send("q", "one again", keyAttr("k"), "")
	stop2 := runConsumer(t, c2.Run)
	waitFor(t, 5*time.Second, "the duplicate to be retried", func() bool { return c2.Stats().Retried >= 1 })
	if got := f.Counts("q").Deleted; got != 0 {
		t.Fatalf("deleted while in progress: got %d, want 0", got)
	}
	close(release)
	waitFor(t, 10*time.Second, "the queue to drain", drained(f, "q"))
	stop1()
	stop2()
	if got := runs.Load(); got != 1 {
		t.Errorf("handler runs: got %d, want 1", got)
	}
	if got := c1.Stats().Replayed + c2.Stats().Replayed; got != 1 {
		t.Errorf("replayed: got %d, want 1", got)
	}
}

// TestLongHandlerKeepsVisibility: a handler that runs longer than the
// visibility timeout keeps its message, because the visibility is renewed.
func TestLongHandlerKeepsVisibility(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	qURL := f.CreateQueue("q", sqsfake.QueueOptions{})
	dURL := f.CreateQueue("dlq", sqsfake.QueueOptions{})
	exec := prooftest.MemExecutor(t, idem.WithLease(time.Second))
	var runs atomic.Int32
	h := func(ctx context.Context, m types.Message) error {
		runs.Add(1)
		select {
		case <-time.After(4500 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
	opts := []sqsconsumer.Option{sqsconsumer.WithWaitTime(time.Second), sqsconsumer.WithVisibilityTimeout(3 * time.Second), consumer.WithConcurrency(2)}
	c, err := sqsconsumer.New(f.client(nil), qURL, dURL, exec, h, opts...)
	if err != nil {
		t.Fatal(err)
	}
	f.Send("q", "slow", keyAttr("slow"), "")
	stop := runConsumer(t, c.Run)
	waitFor(t, 10*time.Second, "the queue to drain", drained(f, "q"))
	stop()
	if got := f.Counts("q").Received; got != 1 {
		t.Errorf("receives: got %d, want 1 (the visibility was not renewed)", got)
	}
	if got := runs.Load(); got != 1 {
		t.Errorf("handler runs: got %d, want 1", got)
	}
}

// TestShutdown: cancelling Run's context lets the running handler finish
// and delete its message; a handler that outlives the shutdown timeout has
// its context cancelled and its message released, not deleted.
func TestShutdown(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name        string
		work        time.Duration
		wantDeleted int
	}{
		{"finishes", 300 * time.Millisecond, 1},
		{"times out", time.Hour, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f := startFake(t)
			qURL := f.CreateQueue("q", sqsfake.QueueOptions{})
			dURL := f.CreateQueue("dlq", sqsfake.QueueOptions{})
			exec := prooftest.MemExecutor(t)
			started := make(chan struct{})
			h := func(ctx context.Context, m types.Message) error {
				close(started)
				select {
				case <-time.After(tt.work):
					return nil
				case <-ctx.Done():
					return context.Cause(ctx)
				}
			}
			c, err := sqsconsumer.New(f.client(nil), qURL, dURL, exec, h,
				sqsconsumer.WithWaitTime(time.Second), consumer.WithShutdownTimeout(time.Second), consumer.WithRetryDelay(0))
			if err != nil {
				t.Fatal(err)
			}
			f.Send("q", "m", keyAttr("k"), "")
			stop := runConsumer(t, c.Run)
			<-started
			begin := time.Now()
			stop()
			if d := time.Since(begin); d > 3*time.Second {
				t.Errorf("Run took %v to return, want about the shutdown timeout (1s) at most", d)
			}
			cnt := f.Counts("q")
			if cnt.Deleted != tt.wantDeleted {
				t.Errorf("deleted: got %d, want %d", cnt.Deleted, tt.wantDeleted)
			}
			if tt.wantDeleted == 0 && cnt.Visible != 1 {
				t.Errorf("released message: got %+v, want it visible again", cnt)
			}
			rec, err := adapterkit.Store(exec).Get(t.Context(), c.Processor().Key("k").Digest())
			wantState := storekit.StateCompleted
			if tt.wantDeleted == 0 {
				wantState = storekit.StateReleased
			}
			if err != nil || rec.State != wantState {
				t.Errorf("record: got %v, %v; want %v", rec.State, err, wantState)
			}
		})
	}
}

// TestBrokerErrorsCounted: failed deletes leave the message on the queue;
// the next receive replays it.
func TestBrokerErrorsCounted(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	qURL := f.CreateQueue("q", sqsfake.QueueOptions{VisibilityTimeout: 3 * time.Second})
	dURL := f.CreateQueue("dlq", sqsfake.QueueOptions{})
	exec := prooftest.MemExecutor(t)
	var failDeletes atomic.Int32
	failDeletes.Store(1)
	rt := &killable{base: nil}
	rt.base = roundTripFunc(func(r *http.Request) (*http.Response, error) {
		if r.Header.Get("X-Amz-Target") == "AmazonSQS.DeleteMessageBatch" && failDeletes.Add(-1) >= 0 {
			return nil, errors.New("connection reset")
		}
		return http.DefaultTransport.RoundTrip(r)
	})
	var runs atomic.Int32
	c, err := sqsconsumer.New(f.client(rt), qURL, dURL, exec, func(ctx context.Context, m types.Message) error {
		runs.Add(1)
		return nil
	}, sqsconsumer.WithWaitTime(time.Second), sqsconsumer.WithVisibilityTimeout(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	f.Send("q", "m", keyAttr("k"), "")
	stop := runConsumer(t, c.Run)
	waitFor(t, 10*time.Second, "the queue to drain", drained(f, "q"))
	stop()
	st := c.Stats()
	if runs.Load() != 1 || st.Processed != 1 || st.Replayed != 1 || st.Errors != 1 {
		t.Errorf("got %d runs, %+v; want 1 run, 1 processed, 1 replayed, 1 error", runs.Load(), st)
	}
}

// TestFingerprintMismatch: a key reused with another payload is
// dead-lettered with idem.ErrMismatch, and a key the store refuses with
// idem.ErrInvalid; neither is run.
func TestFingerprintMismatch(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	qURL := f.CreateQueue("q", sqsfake.QueueOptions{})
	dURL := f.CreateQueue("dlq", sqsfake.QueueOptions{})
	exec := prooftest.MemExecutor(t)
	var runs atomic.Int32
	c, err := sqsconsumer.New(f.client(nil), qURL, dURL, exec, func(ctx context.Context, m types.Message) error {
		runs.Add(1)
		return nil
	}, sqsconsumer.WithWaitTime(time.Second), consumer.WithBatchSize(1),
		sqsconsumer.WithFingerprint(func(m types.Message) string { return sqsconsumer.KeyFromBodyHash(nil)(m)[:16] }))
	if err != nil {
		t.Fatal(err)
	}
	f.Send("q", "pay 10", keyAttr("k"), "")
	f.Send("q", "pay 1000", keyAttr("k"), "")
	f.Send("q", "bad key", keyAttr(strings.Repeat("x", 300)), "") // over storekit.MaxKeyLen
	stop := runConsumer(t, c.Run)
	waitFor(t, 10*time.Second, "the queue to drain", drained(f, "q"))
	stop()
	if got := runs.Load(); got != 1 {
		t.Errorf("handler runs: got %d, want 1", got)
	}
	dl := f.Messages("dlq")
	if len(dl) != 2 || dl[0].Body != "pay 1000" || !strings.Contains(dl[0].Attributes[sqsconsumer.AttrDeadLetterReason].StringValue, "different fingerprint") ||
		dl[1].Body != "bad key" || !strings.Contains(dl[1].Attributes[sqsconsumer.AttrDeadLetterReason].StringValue, "invalid") {
		t.Errorf("dead letters: got %+v, want the second payload (mismatch) and the bad key (invalid)", dl)
	}
}

// TestLargeBatch: a batch above ten is filled with several receives and
// deleted ten entries at a time.
func TestLargeBatch(t *testing.T) {
	t.Parallel()
	f := startFake(t)
	qURL := f.CreateQueue("q", sqsfake.QueueOptions{})
	dURL := f.CreateQueue("dlq", sqsfake.QueueOptions{})
	exec := prooftest.MemExecutor(t)
	var runs atomic.Int32
	c, err := sqsconsumer.New(f.client(nil), qURL, dURL, exec, func(ctx context.Context, m types.Message) error {
		runs.Add(1)
		return nil
	}, sqsconsumer.WithWaitTime(time.Second), consumer.WithBatchSize(100))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 250 {
		k := "k" + string(rune('a'+i%26)) + time.Duration(i).String()
		f.Send("q", k, keyAttr(k), "")
	}
	stop := runConsumer(t, c.Run)
	waitFor(t, 10*time.Second, "the queue to drain", drained(f, "q"))
	// Run refuses to run twice at once.
	if err := c.Run(t.Context()); err == nil {
		t.Error("a second concurrent Run: got nil, want an error")
	}
	stop()
	if got := runs.Load(); got != 250 {
		t.Errorf("handler runs: got %d, want 250", got)
	}
	if st := c.Stats(); st.Processed != 250 || st.Errors != 0 || st.Retried != 0 {
		t.Errorf("stats: got %+v, want 250 processed", st)
	}
}

func TestKeyHelpers(t *testing.T) {
	m := types.Message{Body: aws.String(`{"id":"o-1","amount":5,"at":"now"}`),
		MessageAttributes: map[string]types.MessageAttributeValue{"k": {DataType: aws.String("String"), StringValue: aws.String("h1")}}}
	if sqsconsumer.KeyHeader("k")(m) != "h1" || sqsconsumer.KeyField("id")(m) != "o-1" || sqsconsumer.KeyHash("id", "amount")(m) != consumer.HashKey("o-1", "5") {
		t.Fatalf("got %q %q %q", sqsconsumer.KeyHeader("k")(m), sqsconsumer.KeyField("id")(m), sqsconsumer.KeyHash("id", "amount")(m))
	}
}
