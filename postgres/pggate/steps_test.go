package pggate_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgstore"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// processor is a toy card processor over HTTP that honours
// Idempotency-Key: a key it saw is answered with the charge it made, and
// charges counts the charges it made per order.
type processor struct {
	mu      sync.Mutex
	byKey   map[string]string
	charges map[string]int
	n       int
}

func newProcessor(t *testing.T) (*processor, string) {
	p := &processor{byKey: map[string]string{}, charges: map[string]int{}}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return p, srv.URL
}

func (p *processor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	order := string(body)
	p.mu.Lock()
	defer p.mu.Unlock()
	k := r.Header.Get("Idempotency-Key")
	id, ok := p.byKey[k]
	if !ok || k == "" {
		p.n++
		id = fmt.Sprintf("ch_%d", p.n)
		p.charges[order]++
		if k != "" {
			p.byKey[k] = id
		}
	}
	io.WriteString(w, id)
}

func (p *processor) chargesOf(order string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.charges[order]
}

// charge asks the processor at url to charge order with key.
func charge(ctx context.Context, url, key, order string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(order))
	if err != nil {
		return "", err
	}
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

type flowEnv struct {
	pool *pgxpool.Pool
	gate *pggate.Gate[pgx.Tx]
	exec *idem.Executor
}

// newFlowEnv is a gate on a memstore with the real clock and lease (the
// claims of multi-step requests are compared with the database's clock)
// and the tables of a checkout: orders and charges without unique keys,
// so every duplicate shows.
func newFlowEnv(t *testing.T, lease time.Duration, opts ...pggate.Option) *flowEnv {
	t.Helper()
	pool, _ := pgtest.Pool(t)
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(ms, idem.WithLease(lease))
	if err != nil {
		t.Fatal(err)
	}
	g, err := pggate.New(e, pool, append([]pggate.Option{pggate.WithRelayInterval(0), pggate.WithCompleteInterval(0)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE orders (id text NOT NULL); CREATE TABLE charges (order_id text NOT NULL, charge text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	return &flowEnv{pool: pool, gate: g, exec: e}
}

func (v *flowEnv) count(t *testing.T, table, order string) int {
	t.Helper()
	col := "id"
	if table == "charges" {
		col = "order_id"
	}
	var n int
	if err := v.pool.QueryRow(t.Context(), `SELECT count(*) FROM `+table+` WHERE `+col+` = $1`, order).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// errInjected stands for the process stopping at a step boundary.
var errInjected = errors.New("injected failure")

// checkout is the flow of the example: create the order, charge it at
// the processor with the derived key, record the charge. fault(step)
// runs at the start of every step and may fail it; afterCharge runs after
// the processor answered (an error there is a lost reply).
func checkout(url string, fault func(step string) error, afterCharge func() error) *pggate.Flow[pgx.Tx] {
	return &pggate.Flow[pgx.Tx]{Name: "checkout", Steps: []pggate.Step[pgx.Tx]{
		pggate.Local("order", func(ctx context.Context, tx pgx.Tx, s *pggate.State) error {
			if err := fault("order"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, string(s.Input))
			return err
		}),
		pggate.Foreign[pgx.Tx]("charge", func(ctx context.Context, key string, s *pggate.State) error {
			if err := fault("charge"); err != nil {
				return err
			}
			id, err := charge(ctx, url, key, string(s.Input))
			if err != nil {
				return err
			}
			if err := afterCharge(); err != nil {
				return err
			}
			s.Set("charge", []byte(id))
			return nil
		}),
		pggate.Local("record", func(ctx context.Context, tx pgx.Tx, s *pggate.State) error {
			if err := fault("record"); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO charges (order_id, charge) VALUES ($1, $2)`, string(s.Input), string(s.Get("charge")))
			s.Result = []byte("paid " + string(s.Get("charge")))
			return err
		}),
	}}
}

// TestRunResumesAtEveryBoundary stops the checkout at every step (and
// loses the processor's reply once), retries with the same key, and counts
// orders, charges recorded and charges made at the processor: 1 each, and
// the retries replay the first result. The negative control runs the same
// steps again on every retry with a key of each attempt, as a handler
// without recovery points does: the order and the charge repeat.
func TestRunResumesAtEveryBoundary(t *testing.T) {
	v := newFlowEnv(t, time.Minute)
	proc, url := newProcessor(t)
	for _, stop := range []string{"order", "charge", "record", "lost-reply"} {
		t.Run(stop, func(t *testing.T) {
			order := "o-" + stop
			key := idem.Key{Scope: "checkout", ID: order}
			failed := false
			fault := func(step string) error {
				if step == stop && !failed {
					failed = true
					return errInjected
				}
				return nil
			}
			afterCharge := func() error { return nil } // the processor's reply arrives
			if stop == "lost-reply" {
				afterCharge = func() error { return fault("lost-reply") }
			}
			f := checkout(url, fault, afterCharge)
			if _, err := v.gate.Run(t.Context(), key, "fp", f, []byte(order)); !errors.Is(err, errInjected) {
				t.Fatalf("first run: got %v, want the injected failure", err)
			}
			res, err := v.gate.Run(t.Context(), key, "fp", f, []byte(order))
			if err != nil || res.Replayed || !strings.HasPrefix(string(res.Value), "paid ch_") {
				t.Fatalf("retry: got %q replayed=%v, %v; want paid, not replayed", res.Value, res.Replayed, err)
			}
			again, err := v.gate.Run(t.Context(), key, "fp", f, []byte(order))
			if err != nil || !again.Replayed || string(again.Value) != string(res.Value) {
				t.Fatalf("third run: got %q replayed=%v, %v; want %q replayed", again.Value, again.Replayed, err, res.Value)
			}
			if o, c, p := v.count(t, "orders", order), v.count(t, "charges", order), proc.chargesOf(order); o != 1 || c != 1 || p != 1 {
				t.Fatalf("orders %d, charges recorded %d, charges at the processor %d; want 1 each", o, c, p)
			}
		})
	}
	// Negative control: no recovery points, the charge sent with a key of
	// its own per attempt.
	order := "o-control"
	var attempt int
	naive := func(ctx context.Context) error {
		attempt++
		tx, err := v.pool.Begin(ctx)
		if err != nil {
			return err
		}
		defer tx.Rollback(ctx)
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id) VALUES ($1)`, order); err != nil {
			return err
		}
		if err := tx.Commit(ctx); err != nil {
			return err
		}
		if _, err := charge(ctx, url, fmt.Sprintf("%s-attempt-%d", order, attempt), order); err != nil {
			return err
		}
		if attempt == 1 {
			return errInjected // stopped before recording the charge
		}
		_, err = v.pool.Exec(ctx, `INSERT INTO charges (order_id, charge) VALUES ($1, 'x')`, order)
		return err
	}
	if err := naive(t.Context()); !errors.Is(err, errInjected) {
		t.Fatal(err)
	}
	if err := naive(t.Context()); err != nil {
		t.Fatal(err)
	}
	if o, p := v.count(t, "orders", order), proc.chargesOf(order); o != 2 || p != 2 {
		t.Fatalf("control: orders %d, charges at the processor %d; want 2 each (the duplicates the steps prevent)", o, p)
	}
}

// TestRunDerivedKeyStable checks that the foreign step's key is the
// request's digest and the step's name, the same on every retry.
func TestRunDerivedKeyStable(t *testing.T) {
	v := newFlowEnv(t, time.Minute)
	key := idem.Key{Scope: "s", ID: "k"}
	var keys []string
	n := 0
	f := &pggate.Flow[pgx.Tx]{Name: "f", Steps: []pggate.Step[pgx.Tx]{
		pggate.Local("a", func(context.Context, pgx.Tx, *pggate.State) error { return nil }),
		pggate.Foreign[pgx.Tx]("call", func(_ context.Context, k string, _ *pggate.State) error {
			keys = append(keys, k)
			if n++; n == 1 {
				return errInjected
			}
			return nil
		}),
	}}
	v.gate.Run(t.Context(), key, "", f, nil)
	if _, err := v.gate.Run(t.Context(), key, "", f, nil); err != nil {
		t.Fatal(err)
	}
	want := pggate.DerivedKey(key.Digest(), "call")
	if len(keys) != 2 || keys[0] != want || keys[1] != want {
		t.Fatalf("got keys %q, want %q twice", keys, want)
	}
}

// TestCompleterFinishesAbandoned leaves a checkout stuck inside its
// foreign step (its owner stops answering, as a process that died) and
// runs the completer: once the owner's claim ran out it finishes the
// request (1 order, 1 charge, 1 charge at the processor), the stuck owner
// is refused when it wakes (ErrClaimLost, or its lease was lost) and a retry replays. Without the
// flow registered the completer leaves the request unfinished (the
// negative control).
func TestCompleterFinishesAbandoned(t *testing.T) {
	v := newFlowEnv(t, 300*time.Millisecond)
	proc, url := newProcessor(t)
	order := "o-abandoned"
	key := idem.Key{Scope: "checkout", ID: order}
	stuck, wake := make(chan struct{}), make(chan struct{})
	var once sync.Once
	first := checkout(url, func(step string) error {
		if step == "charge" {
			once.Do(func() { close(stuck); <-wake })
		}
		return nil
	}, func() error { return nil })
	errc := make(chan error, 1)
	go func() {
		_, err := v.gate.Run(context.Background(), key, "fp", first, []byte(order))
		errc <- err
	}()
	<-stuck
	// Negative control: nothing registered, nothing finishes.
	if fin, failed, err := v.gate.Complete(t.Context()); fin != 0 || failed != 0 || err != nil {
		t.Fatalf("unregistered: finished %d, failed %d, %v; want 0, 0", fin, failed, err)
	}
	if err := v.gate.Register(checkout(url, func(string) error { return nil }, func() error { return nil })); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		fin, _, err := v.gate.Complete(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if fin == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the completer did not finish the abandoned request")
		}
		time.Sleep(50 * time.Millisecond) // the claim runs out on the database's clock
	}
	close(wake)
	// The stuck owner is refused: its next step's claim check fails, or
	// its attempt lost the store's lease first (the completion relayed).
	if err := <-errc; !errors.Is(err, pggate.ErrClaimLost) && !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("stuck owner: got %v, want ErrClaimLost or idem.ErrLeaseLost", err)
	}
	res, err := v.gate.Run(t.Context(), key, "fp", first, []byte(order))
	if err != nil || !res.Replayed || !strings.HasPrefix(string(res.Value), "paid ch_") {
		t.Fatalf("retry: got %q replayed=%v, %v; want the completer's result replayed", res.Value, res.Replayed, err)
	}
	if o, c, p := v.count(t, "orders", order), v.count(t, "charges", order), proc.chargesOf(order); o != 1 || c != 1 || p != 1 {
		t.Fatalf("orders %d, charges recorded %d, charges at the processor %d; want 1 each", o, c, p)
	}
}

// TestCompleterGivesUp: a request whose flow nobody registered is marked
// failed once past the bound, with the reason, and a retry gets an
// *idem.FailedError carrying it.
func TestCompleterGivesUp(t *testing.T) {
	v := newFlowEnv(t, time.Minute, pggate.WithGiveUpAfter(time.Millisecond))
	_, url := newProcessor(t)
	key := idem.Key{Scope: "checkout", ID: "o-given-up"}
	f := checkout(url, func(step string) error {
		if step == "charge" {
			return errInjected
		}
		return nil
	}, func() error { return nil })
	if _, err := v.gate.Run(t.Context(), key, "fp", f, []byte("o-given-up")); !errors.Is(err, errInjected) {
		t.Fatal(err)
	}
	var fin, failed int
	deadline := time.Now().Add(10 * time.Second)
	for failed == 0 && time.Now().Before(deadline) {
		var err error
		if fin, failed, err = v.gate.Complete(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
	if fin != 0 || failed != 1 {
		t.Fatalf("got finished %d, failed %d; want 0, 1", fin, failed)
	}
	_, err := v.gate.Run(t.Context(), key, "fp", f, []byte("o-given-up"))
	var fe *idem.FailedError
	if !errors.As(err, &fe) || !strings.Contains(fe.Message, `step "order" of flow "checkout"`) {
		t.Fatalf("retry: got %v, want a FailedError naming the step", err)
	}
}

// TestDoRefusesUnfinishedFlow: Do on a key whose row is an unfinished
// multi-step request rolls back and says so, instead of replaying an
// empty result.
func TestDoRefusesUnfinishedFlow(t *testing.T) {
	v := newFlowEnv(t, time.Minute)
	key := idem.Key{Scope: "s", ID: "mixed"}
	f := &pggate.Flow[pgx.Tx]{Name: "f", Steps: []pggate.Step[pgx.Tx]{
		pggate.Local("a", func(context.Context, pgx.Tx, *pggate.State) error { return nil }),
		pggate.Local("b", func(context.Context, pgx.Tx, *pggate.State) error { return errInjected }),
	}}
	if _, err := v.gate.Run(t.Context(), key, "", f, nil); !errors.Is(err, errInjected) {
		t.Fatal(err)
	}
	_, err := v.gate.Do(t.Context(), key, "", func(context.Context, pgx.Tx) ([]byte, error) { return []byte("x"), nil })
	if !errors.Is(err, pggate.ErrNotFlow) {
		t.Fatalf("got %v, want ErrNotFlow", err)
	}
}

// TestRunOnPgstore: on pgstore the steps' transactions do not complete the
// record, so Run gives the store the completion after the last commit; a
// retry then replays from the store (without it, the record stayed
// IN_PROGRESS and the retry got an *idem.InProgressError).
func TestRunOnPgstore(t *testing.T) {
	pool, _ := pgtest.Pool(t)
	ps, err := pgstore.New(pool)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ps.Close() })
	if err := ps.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(ps, idem.WithLease(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	g, err := pggate.New(e, pool, pggate.WithRelayInterval(0), pggate.WithCompleteInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Close() })
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(t.Context(), `CREATE TABLE orders (id text NOT NULL); CREATE TABLE charges (order_id text NOT NULL, charge text NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	proc, url := newProcessor(t)
	key := idem.Key{Scope: "checkout", ID: "o-pg"}
	f := checkout(url, func(string) error { return nil }, func() error { return nil })
	first, err := g.Run(t.Context(), key, "fp", f, []byte("o-pg"))
	if err != nil || first.Replayed {
		t.Fatalf("first: %q replayed=%v, %v", first.Value, first.Replayed, err)
	}
	again, err := g.Run(t.Context(), key, "fp", f, []byte("o-pg"))
	if err != nil || !again.Replayed || string(again.Value) != string(first.Value) {
		t.Fatalf("retry: got %q replayed=%v, %v; want %q replayed", again.Value, again.Replayed, err, first.Value)
	}
	if p := proc.chargesOf("o-pg"); p != 1 {
		t.Fatalf("charges at the processor %d, want 1", p)
	}
}
