package pgoutbox_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/postgres/pgoutbox"
	"github.com/jackc/pgx/v5/pgxpool"
)

const waitTimeout = 30 * time.Second

// sendUntil calls r.Send until cond holds, failing t after waitTimeout.
func sendUntil(t *testing.T, r *pgoutbox.Relay, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(waitTimeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", waitTimeout)
		}
		r.Send(t.Context()) // errors are the failures the test injects
	}
}

// orderRun publishes rows per key of keys (seq 0..rows-1, each in a
// transaction of its own, in order), then runs relays concurrently until
// every row is sent; the first attempt of every third row fails. It
// returns, per key, the sequence of confirmed sends, and the number of
// times two sends of one key were in flight at once.
func orderRun(t *testing.T, keys, rows, relays int, opts ...pgoutbox.Option) (map[string][]int, int) {
	t.Helper()
	pool, _ := newPool(t)
	for s := range rows {
		for k := range keys {
			publish(t, pool, "events", fmt.Sprintf("key-%d", k), fmt.Sprintf("key-%d/%d", k, s), nil)
		}
	}
	rec := newRecorder()
	rec.fail = func(key, payload string, n int) error {
		seq, _ := strconv.Atoi(payload[strings.IndexByte(payload, '/')+1:])
		if seq%3 == 1 && n == 0 {
			return errors.New("broker refused")
		}
		return nil
	}
	rec.hold = func(string, string) { time.Sleep(time.Millisecond) } // a broker's round trip, so that sends overlap
	opts = append([]pgoutbox.Option{pgoutbox.WithBatchSize(20), pgoutbox.WithBackoff(5*time.Millisecond, 5*time.Millisecond), pgoutbox.WithConcurrency(8)}, opts...)
	var wg sync.WaitGroup
	for range relays {
		r := newRelay(t, pool, map[string]pgoutbox.Sender{"events": rec}, opts...)
		wg.Go(func() {
			deadline := time.Now().Add(waitTimeout)
			for unsent(t, pool) > 0 && time.Now().Before(deadline) {
				r.Send(t.Context())
			}
		})
	}
	wg.Wait()
	if u := unsent(t, pool); u != 0 {
		t.Fatalf("%d rows unsent after %v", u, waitTimeout)
	}
	seqs := make(map[string][]int)
	for _, p := range rec.confirmed() {
		k, s, _ := strings.Cut(p, "/")
		n, _ := strconv.Atoi(s)
		seqs[k] = append(seqs[k], n)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return seqs, rec.overlaps
}

// TestOrderPerKeySeveralRelays: 4 relays share 40 keys × 8 rows; every
// key's rows reach the broker in order, one at a time, though a third of
// the first sends fail.
func TestOrderPerKeySeveralRelays(t *testing.T) {
	const keys, rows, relays = 40, 8, 4
	seqs, overlaps := orderRun(t, keys, rows, relays)
	outOfOrder := 0
	for k := range keys {
		got := seqs[fmt.Sprintf("key-%d", k)]
		if len(got) != rows {
			t.Errorf("key-%d: %d rows confirmed, want %d (each once)", k, len(got), rows)
		}
		for i := 1; i < len(got); i++ {
			if got[i] < got[i-1] {
				outOfOrder++
			}
		}
	}
	if outOfOrder != 0 || overlaps != 0 {
		t.Fatalf("%d rows confirmed after a later row of their key, %d sends of a key while another was in flight; want 0 and 0", outOfOrder, overlaps)
	}
}

// TestSecondRowWaitsForTheFirst: relay A holds key k's first row (its
// broker has not confirmed it yet) while relay B looks for work: B must
// not send k's second row, only another key's. The negative control, the
// same relays without the rule that only the first unsent row of a key is
// claimed, sends k/1 while k/0 is in flight, and before it.
func TestSecondRowWaitsForTheFirst(t *testing.T) {
	for _, control := range []bool{false, true} {
		name := "rule"
		var opts []pgoutbox.Option
		if control {
			name, opts = "control", []pgoutbox.Option{pgoutbox.WithAnyOrder()}
		}
		t.Run(name, func(t *testing.T) {
			pool, _ := newPool(t)
			publish(t, pool, "d", "k", "k/0", nil)
			publish(t, pool, "d", "k", "k/1", nil)
			publish(t, pool, "d", "other", "other/0", nil)
			rec := newRecorder()
			holding, release := make(chan struct{}), make(chan struct{})
			rec.hold = func(_, payload string) {
				if payload == "k/0" {
					close(holding)
					<-release
				}
			}
			a := newRelay(t, pool, map[string]pgoutbox.Sender{"d": rec}, append(opts, pgoutbox.WithBatchSize(1))...)
			b := newRelay(t, pool, map[string]pgoutbox.Sender{"d": rec}, opts...)
			done := make(chan error, 1)
			go func() { _, err := a.Send(t.Context()); done <- err }()
			<-holding
			n, err := b.Send(t.Context())
			close(release)
			if err != nil {
				t.Fatal(err)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			rec.mu.Lock()
			overlaps := rec.overlaps
			rec.mu.Unlock()
			got := strings.Join(rec.confirmed(), " ")
			t.Logf("B sent %d while A held k/0; confirmed: %s; overlapping sends of k: %d", n, got, overlaps)
			switch {
			case !control && (n != 1 || got != "other/0 k/0 k/1" || overlaps != 0):
				t.Fatalf("got B sending %d, confirmed %q, %d overlaps; want 1 (other/0), \"other/0 k/0 k/1\", 0", n, got, overlaps)
			case control && (!strings.Contains(got, "k/1") || strings.Index(got, "k/1") > strings.Index(got, "k/0") || overlaps != 1):
				t.Fatalf("control: got confirmed %q, %d overlaps; want k/1 sent while k/0 was in flight, and confirmed before it", got, overlaps)
			}
		})
	}
}

// TestFailedSendHoldsItsKey: a row whose send fails stays unsent with its
// error and attempts, and holds back the later rows of its key, not the
// rows of other keys; once the broker takes it, the key's rows follow in
// order.
func TestFailedSendHoldsItsKey(t *testing.T) {
	pool, _ := newPool(t)
	publish(t, pool, "d", "a", "a/0", nil)
	publish(t, pool, "d", "a", "a/1", nil)
	publish(t, pool, "d", "b", "b/0", nil)
	rec := newRecorder()
	var mu sync.Mutex
	down := true
	rec.fail = func(key, _ string, _ int) error {
		mu.Lock()
		defer mu.Unlock()
		if key == "a" && down {
			return errors.New("queue not found")
		}
		return nil
	}
	r := newRelay(t, pool, map[string]pgoutbox.Sender{"d": rec}, pgoutbox.WithBackoff(time.Millisecond, time.Millisecond))
	n, err := r.Send(t.Context())
	if n != 1 || err == nil || !strings.Contains(err.Error(), "queue not found") {
		t.Fatalf("Send: got %d, %v, want 1 and the error of a/0", n, err)
	}
	var attempts int
	var lastErr string
	if err := pool.QueryRow(t.Context(), `SELECT attempts, last_error FROM idem_outbox WHERE payload = 'a/0'`).Scan(&attempts, &lastErr); err != nil {
		t.Fatal(err)
	}
	if attempts != 1 || lastErr != "queue not found" {
		t.Fatalf("a/0: got attempts %d, last_error %q, want 1, queue not found", attempts, lastErr)
	}
	sendUntil(t, r, func() bool { return len(rec.snapshot()) >= 3 }) // a/0 failed twice
	if got := rec.confirmed(); len(got) != 1 || got[0] != "b/0" {
		t.Fatalf("confirmed while a/0 fails: got %v, want only b/0 (a/1 waits for a/0)", got)
	}
	mu.Lock()
	down = false
	mu.Unlock()
	sendUntil(t, r, func() bool { return unsent(t, pool) == 0 })
	if got := rec.confirmed(); strings.Join(got, " ") != "b/0 a/0 a/1" {
		t.Fatalf("confirmed: got %v, want b/0 a/0 a/1", got)
	}
}

// TestRelayLeavesOtherDestinations: rows of a destination the relay has
// no route for are left for another relay.
func TestRelayLeavesOtherDestinations(t *testing.T) {
	pool, _ := newPool(t)
	publish(t, pool, "mine", "k", "m", nil)
	publish(t, pool, "theirs", "k", "t", nil)
	mine, theirs := newRecorder(), newRecorder()
	if n, err := newRelay(t, pool, map[string]pgoutbox.Sender{"mine": mine}).Send(t.Context()); n != 1 || err != nil {
		t.Fatalf("Send: got %d, %v, want 1, nil", n, err)
	}
	if u := unsent(t, pool); u != 1 {
		t.Fatalf("unsent: got %d, want 1 (the other destination's row)", u)
	}
	if n, err := newRelay(t, pool, map[string]pgoutbox.Sender{"theirs": theirs}).Send(t.Context()); n != 1 || err != nil {
		t.Fatalf("the other relay's Send: got %d, %v, want 1, nil", n, err)
	}
	if a, b := mine.confirmed(), theirs.confirmed(); len(a) != 1 || a[0] != "m" || len(b) != 1 || b[0] != "t" {
		t.Fatalf("got %v and %v, want [m] and [t]", a, b)
	}
}

// TestSweep deletes the rows sent longer ago than the retention, and no
// other.
func TestSweep(t *testing.T) {
	pool, _ := newPool(t)
	for i := range 5 {
		publish(t, pool, "d", "k"+strconv.Itoa(i), "p", nil)
	}
	publish(t, pool, "other", "k", "never sent", nil)
	r := newRelay(t, pool, map[string]pgoutbox.Sender{"d": newRecorder()}, pgoutbox.WithRetention(time.Hour), pgoutbox.WithBatchSize(2))
	if n, err := r.Send(t.Context()); n != 5 || err != nil {
		t.Fatalf("Send: got %d, %v, want 5, nil", n, err)
	}
	if _, err := pool.Exec(t.Context(), `UPDATE idem_outbox SET sent_at = now() - interval '2 hours' WHERE key IN ('k0', 'k1', 'k2')`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `UPDATE idem_outbox SET created_at = now() - interval '2 hours' WHERE destination = 'other'`); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Sweep(t.Context()); n != 3 || err != nil {
		t.Fatalf("Sweep: got %d, %v, want 3, nil", n, err)
	}
	var left []string
	rows, _ := pool.Query(t.Context(), `SELECT key FROM idem_outbox ORDER BY id`)
	for rows.Next() {
		var k string
		rows.Scan(&k)
		left = append(left, k)
	}
	if strings.Join(left, " ") != "k3 k4 k" {
		t.Fatalf("rows left: got %v, want k3 k4 and the unsent k", left)
	}
}

// TestKilledBeforeMark: the relay's connection dies after the broker
// confirmed a batch and before it is marked (the backend is terminated
// inside the last Send): the rows stay unsent and the next pass sends them
// again. At least once: the consumer deduplicates by key.
func TestKilledBeforeMark(t *testing.T) {
	pool, url := newPool(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	app := fmt.Sprintf("pgoutbox-kill-%d", time.Now().UnixNano())
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	relayPool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(relayPool.Close)
	for i := range 3 {
		publish(t, pool, "d", "k"+strconv.Itoa(i), "p"+strconv.Itoa(i), nil)
	}
	rec := newRecorder()
	var once sync.Once
	rec.hold = func(key, _ string) {
		if key != "k2" {
			return
		}
		once.Do(func() {
			if _, err := pool.Exec(context.Background(), `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1`, app); err != nil {
				t.Error(err)
			}
		})
	}
	r := newRelay(t, relayPool, map[string]pgoutbox.Sender{"d": rec}, pgoutbox.WithConcurrency(1))
	if n, err := r.Send(t.Context()); err == nil || n != 0 {
		t.Fatalf("Send with the connection killed before the mark: got %d, %v, want 0 and an error", n, err)
	}
	if u := unsent(t, pool); u != 3 {
		t.Fatalf("unsent after the kill: got %d, want 3", u)
	}
	sendUntil(t, r, func() bool { return unsent(t, pool) == 0 })
	if got := strings.Join(rec.confirmed(), " "); got != "p0 p1 p2 p0 p1 p2" {
		t.Fatalf("confirmed: got %s, want each row twice, in order", got)
	}
}

// TestRunSendsAndStops: Run sends what is published while it runs and
// returns nil when its context is cancelled.
func TestRunSendsAndStops(t *testing.T) {
	pool, _ := newPool(t)
	rec := newRecorder()
	r := newRelay(t, pool, map[string]pgoutbox.Sender{"d": rec}, pgoutbox.WithInterval(5*time.Millisecond))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	for i := range 10 {
		publish(t, pool, "d", "k"+strconv.Itoa(i), "p", nil)
	}
	deadline := time.Now().Add(waitTimeout)
	for len(rec.confirmed()) < 10 {
		if time.Now().After(deadline) {
			t.Fatalf("Run sent %d of 10 within %v", len(rec.confirmed()), waitTimeout)
		}
		time.Sleep(5 * time.Millisecond) // poll the recorder
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: got %v, want nil", err)
		}
	case <-time.After(waitTimeout):
		t.Fatal("Run did not return after its context was cancelled")
	}
}
