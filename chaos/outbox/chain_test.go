package outbox

import (
	"context"
	crand "crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/rabbitmq"
	"github.com/idemgo/idem/consumer/redisstream"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgoutbox"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/redistest"
)

// Environment of the chain's services, besides envPG, envCtl, envStopEvery
// and the broker's.
const (
	envRedis = "IDEM_OB_REDIS" // the service's store (through a fault proxy)
	envMode  = "IDEM_OB_MODE"  // service B: gate, or control (no deduplication)
)

// chainLease is the services' lease: a killed owner's key is taken over
// after it.
const chainLease = 2 * time.Second

// chainStopEvery puts the chain's kill points (the relay after a
// confirmation, service B after its effect committed) at one key in 10.
const chainStopEvery = 10

// runServiceA is service A: an HTTP API whose POST makes an order and
// publishes "order created" to the outbox, in one transaction through the
// commit gate, under idemhttp's middleware (the request's Idempotency-Key).
func runServiceA() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(envPG))
	if err != nil {
		return err
	}
	defer pool.Close()
	rdb := redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis)})
	defer rdb.Close()
	exec, gate, err := serviceGate(pool, rdb)
	if err != nil {
		return err
	}
	defer gate.Close()
	mw, err := idemhttp.New(exec, idemhttp.WithPolicy(idemhttp.ReleaseServerErrors))
	if err != nil {
		return err
	}
	h := gate.HTTP(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
		ctx := r.Context()
		key := r.Header.Get("Idempotency-Key")
		if _, err := tx.Exec(ctx, `INSERT INTO orders (key) VALUES ($1)`, key); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		body := []byte(`{"order":"` + key + `"}`)
		if err := pgoutbox.Publish(ctx, tx, destination, key+":created", body, map[string]string{"type": "order.created"}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		w.Write(body)
	})
	// A port of its own at every start, which it tells the parent: the
	// port of the one before may have been taken since it was killed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	chaostest.Say("listening %s", ln.Addr())
	return (&http.Server{Handler: mw.Handler(h), ReadHeaderTimeout: 10 * time.Second}).Serve(ln)
}

// runServiceB is service B: a consumer of the broker that records one
// effect per order. In gate mode, the idem consumer adapter with the
// effect committed through pggate.Handle; in control mode, no
// deduplication (a new key for every delivery) and the effect committed
// on its own. At its kill points it stops right after the effect
// committed, before the key is completed and the message acknowledged.
func runServiceB() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(envPG))
	if err != nil {
		return err
	}
	defer pool.Close()
	ctl := redis.NewClient(&redis.Options{Addr: os.Getenv(envCtl)})
	defer ctl.Close()
	kind, gated := os.Getenv(envKind), os.Getenv(envMode) == "gate"
	var storeRedis *redis.Client
	var storeOpts []redisstore.Option
	if kind == "redisstream" { // records and the stream share a Redis, and a hash tag
		storeRedis = redis.NewClient(&redis.Options{Addr: os.Getenv(envBroker)})
		storeOpts = append(storeOpts, redisstore.WithHashTag(streamTag))
	} else {
		storeRedis = redis.NewClient(&redis.Options{Addr: os.Getenv(envRedis)})
	}
	defer storeRedis.Close()
	exec, gate, err := serviceGate(pool, storeRedis, storeOpts...)
	if err != nil {
		return err
	}
	defer gate.Close()
	insert := `INSERT INTO effects (key) VALUES ($1)`
	handle := func(ctx context.Context, key string) error {
		var err error
		if gated {
			err = gate.Handle(ctx, func(ctx context.Context, tx pgx.Tx) error {
				_, err := tx.Exec(ctx, insert, key)
				return err
			})
		} else {
			_, err = pool.Exec(ctx, insert, key)
		}
		if err == nil && keyNumber(key)%chainStopEvery == chainStopEvery/2 {
			if ok, serr := ctl.SetNX(context.WithoutCancel(ctx), "ob:stopped:b:"+key, 1, 0).Result(); serr == nil && ok {
				stopSelf("service-b %s", key)
			}
		}
		return err
	}
	opts := []consumer.Option{consumer.WithRetryDelay(100 * time.Millisecond), consumer.WithMaxDeliveries(0)}
	var run func(context.Context) error
	switch kind {
	case "rabbitmq":
		queue := os.Getenv(envDest)
		opts = append(opts, consumer.WithScope(queue), rabbitmq.WithBatchWait(10*time.Millisecond), rabbitmq.WithMaxDelay(chainLease),
			rabbitmq.WithBackoff(50*time.Millisecond, time.Second), rabbitmq.WithPrefetch(8))
		if !gated {
			opts = append(opts, rabbitmq.WithKeyFunc(func(*amqp.Delivery) string { return randomKey() }))
		}
		c, err := rabbitmq.New(os.Getenv(envBroker), queue, exec, func(ctx context.Context, d *amqp.Delivery) error {
			return handle(ctx, d.MessageId)
		}, opts...)
		if err != nil {
			return err
		}
		run = c.Run
	case "redisstream":
		opts = append(opts, redisstream.WithBlock(50*time.Millisecond))
		if !gated {
			opts = append(opts, redisstream.WithKeyFunc(func(redis.XMessage) string { return randomKey() }))
		}
		c, err := redisstream.New(storeRedis, os.Getenv(envDest), "billing", "b-"+strconv.Itoa(os.Getpid()), exec,
			func(ctx context.Context, m redis.XMessage) error {
				k, _ := m.Values["key"].(string)
				return handle(ctx, k)
			}, opts...)
		if err != nil {
			return err
		}
		run = c.Run
	default:
		return fmt.Errorf("unknown broker %q", kind)
	}
	chaostest.Say("consuming")
	return run(ctx)
}

// serviceGate returns a service's Executor, on a redisstore of rdb with
// opts, and its commit gate on pool, whose relay repairs Redis quickly.
func serviceGate(pool *pgxpool.Pool, rdb *redis.Client, opts ...redisstore.Option) (*idem.Executor, *pggate.Gate[pgx.Tx], error) {
	store, err := redisstore.New(rdb, opts...)
	if err != nil {
		return nil, nil, err
	}
	exec, err := idem.New(store, idem.WithLease(chainLease))
	if err != nil {
		return nil, nil, err
	}
	gate, err := pggate.New(exec, pool, pggate.WithRelayInterval(200*time.Millisecond), pggate.WithRelayDelay(500*time.Millisecond))
	return exec, gate, err
}

func randomKey() string {
	var b [12]byte
	crand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// supervisor runs a child role and starts it again whenever it exits: it
// kills the child at its kill points ("stopped …" on its stdout), and
// kill kills it at any point.
type supervisor struct {
	t    *testing.T
	role string
	env  []string
	said func(line string) // called with the child's other lines, if not nil

	mu       sync.Mutex
	p        *chaostest.Proc
	stopping bool
	done     chan struct{}

	starts, stops, kills atomic.Int64
}

func supervise(t *testing.T, role string, said func(line string), env ...string) *supervisor {
	s := &supervisor{t: t, role: role, env: env, said: said, done: make(chan struct{})}
	go s.loop()
	return s
}

func (s *supervisor) loop() {
	defer close(s.done)
	for {
		s.mu.Lock()
		if s.stopping {
			s.mu.Unlock()
			return
		}
		p := chaostest.StartChild(s.t, s.role, s.env...)
		s.p = p
		s.mu.Unlock()
		s.starts.Add(1)
		for {
			line, ok := p.NextLine(time.Second)
			if strings.HasPrefix(line, "stopped ") {
				s.stops.Add(1)
				p.Kill()
				break
			}
			if ok && s.said != nil {
				s.said(line)
			}
			if !ok {
				_ = p.Wait(50 * time.Millisecond)
				if p.Exited() {
					break
				}
			}
		}
	}
}

// kill kills the child (SIGKILL); the supervisor starts another.
func (s *supervisor) kill() {
	s.mu.Lock()
	p := s.p
	s.mu.Unlock()
	if p != nil && !p.Exited() {
		s.kills.Add(1)
		p.Kill()
	}
}

// stop kills the child and starts no other.
func (s *supervisor) stop() {
	s.mu.Lock()
	s.stopping = true
	p := s.p
	s.mu.Unlock()
	if p != nil {
		p.Kill()
	}
	<-s.done
}

// hop is a connection of the chain with a fault proxy in front of it.
type hop struct {
	name   string
	px     *chaostest.NetProxy
	faults int
}

// TestOutboxChain: HTTP request → service A (commit gate: order + outbox
// row) → relay → RabbitMQ or Redis Streams → service B (idem consumer,
// commit gate: effect) with connection resets and cuts on every hop
// (client–A, A–Postgres, A–Redis, relay–Postgres, relay–broker,
// broker–B, B–Postgres, B–Redis), A, the relay and B killed at random, and
// kill points: the relay right after the broker confirmed a message and
// before the mark, B right after its effect committed and before the ack.
// Every request is retried with its key until it gets a 2xx. Effects per
// request at B: exactly 1. The negative control, service B without its
// deduplication (a new key per delivery, the effect committed on its own),
// shows more than 1 for some.
func TestOutboxChain(t *testing.T) {
	for _, kind := range []string{"rabbitmq", "redisstream"} {
		for _, mode := range []string{"gate", "control"} {
			t.Run(kind+"/"+mode, func(t *testing.T) { testChain(t, kind, mode, true) })
		}
	}
}

// TestOutboxBrokerRedelivery: the chain without faults and without the
// relay's kill points: service B alone is killed right after its effect
// committed and before its ack, at one key in 10, so the broker delivers
// those messages again (RabbitMQ requeues them when B's connection closes;
// Redis Streams lets another consumer claim them once idle). Effects per
// request at B: exactly 1; the control, without B's deduplication, makes
// at least one more effect per kill.
func TestOutboxBrokerRedelivery(t *testing.T) {
	for _, kind := range []string{"rabbitmq", "redisstream"} {
		for _, mode := range []string{"gate", "control"} {
			t.Run(kind+"/"+mode, func(t *testing.T) { testChain(t, kind, mode, false) })
		}
	}
}

// testChain runs the chain on the broker kind with service B in mode
// (gate or control); faulty adds the faults and the relay's kill points.
func testChain(t *testing.T, kind, mode string, faulty bool) {
	requests := chaostest.Size(200, 1000)
	if !faulty {
		requests = chaostest.Size(100, 1000)
	}
	ctx := t.Context()

	stores := redistest.Start(t)
	ctl := stores.GoRedis(t)
	poolA, urlA := pgtest.Pool(t)
	poolB, urlB := pgtest.Pool(t)
	for _, st := range []struct {
		pool *pgxpool.Pool
		sql  string
	}{
		{poolA, pggate.Schema}, {poolA, `CREATE TABLE orders (key text NOT NULL)`},
		{poolB, pggate.Schema}, {poolB, `CREATE TABLE effects (key text NOT NULL)`},
	} {
		if _, err := st.pool.Exec(ctx, st.sql); err != nil {
			t.Fatal(err)
		}
	}
	if err := pgoutbox.Migrate(ctx, poolA); err != nil {
		t.Fatal(err)
	}

	pgAddr := hostOf(t, pgtest.BaseURL())
	proxy := func(name, upstream string) *hop { return &hop{name: name, px: chaostest.StartNetProxy(t, upstream)} }
	hops := []*hop{
		proxy("client–A", ""), // pointed at service A when it says where it listens
		proxy("A–Postgres", pgAddr), proxy("A–Redis", stores.Addr()),
		proxy("relay–Postgres", pgAddr), proxy("B–Postgres", pgAddr),
	}
	httpHop, pgA, redisA, pgR, pgB := hops[0], hops[1], hops[2], hops[3], hops[4]
	var relayBroker, brokerB, redisB *hop
	var relayEnv, bEnv []string
	var drained func() bool
	switch kind {
	case "rabbitmq":
		queue := declareQueue(t)
		relayBroker, brokerB, redisB = proxy("relay–RabbitMQ", "127.0.0.1:5672"), proxy("RabbitMQ–B", "127.0.0.1:5672"), proxy("B–Redis", stores.Addr())
		hops = append(hops, relayBroker, brokerB, redisB)
		relayEnv = []string{envKind + "=rabbitmq", envBroker + "=amqp://guest:guest@" + relayBroker.px.Addr() + "/", envDest + "=/" + queue}
		bEnv = []string{envKind + "=rabbitmq", envBroker + "=amqp://guest:guest@" + brokerB.px.Addr() + "/", envDest + "=" + queue, envRedis + "=" + redisB.px.Addr()}
		drained = func() bool { return chaostest.RabbitMQMessages(t, queue, queue+".retry") == 0 }
	case "redisstream":
		bus := redistest.Start(t)
		busRdb := bus.GoRedis(t)
		stream := "{" + streamTag + "}:" + destination
		relayBroker, brokerB = proxy("relay–Redis Streams", bus.Addr()), proxy("Redis Streams–B", bus.Addr())
		hops = append(hops, relayBroker, brokerB)
		relayEnv = []string{envKind + "=redisstream", envBroker + "=" + relayBroker.px.Addr(), envDest + "=" + stream}
		bEnv = []string{envKind + "=redisstream", envBroker + "=" + brokerB.px.Addr(), envDest + "=" + stream}
		drained = func() bool { return streamBacklog(t, busRdb, stream) == 0 }
	}
	common := []string{envCtl + "=" + stores.Addr(), envStopEvery + "=" + strconv.Itoa(chainStopEvery)}
	pointClientHop := func(line string) {
		if addr, ok := strings.CutPrefix(line, "listening "); ok {
			httpHop.px.SetUpstream(addr)
		}
	}
	svcA := supervise(t, "service-a", pointClientHop, append(common, envPG+"="+viaProxy(t, urlA, pgA), envRedis+"="+redisA.px.Addr())...)
	relayStops := common
	if !faulty {
		relayStops = []string{envCtl + "=" + stores.Addr()}
	}
	relay := supervise(t, "relay", nil, append(append(relayStops, relayEnv...), envPG+"="+viaProxy(t, urlA, pgR))...)
	svcB := supervise(t, "service-b", nil, append(append(common, bEnv...), envPG+"="+viaProxy(t, urlB, pgB), envMode+"="+mode)...)
	children := []*supervisor{svcA, relay, svcB}

	// The clients: every request retried with its key until a 2xx.
	var c chaostest.Counters
	var errMu sync.Mutex
	errKinds := map[string]int{}
	client := &http.Client{Timeout: 10 * time.Second}
	next := make(chan int)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for i := range next {
				key := fmt.Sprintf("req-%05d", i)
				for {
					c.Attempted.Add(1)
					status, err := post(client, "http://"+httpHop.px.Addr()+"/orders", key)
					if err == nil && status/100 == 2 {
						c.Acknowledged.Add(1)
						break
					}
					what := strconv.Itoa(status)
					if err != nil {
						what = errKind(err)
					}
					errMu.Lock()
					errKinds[what]++
					errMu.Unlock()
					time.Sleep(20 * time.Millisecond) // the client's pause before its retry
				}
			}
		})
	}
	go func() {
		defer close(next)
		pace := time.NewTicker(40 * time.Millisecond)
		defer pace.Stop()
		for i := range requests {
			select {
			case next <- i:
			case <-ctx.Done():
				return
			}
			<-pace.C
		}
	}()
	clientsDone := make(chan struct{})
	go func() { wg.Wait(); close(clientsDone) }()

	// The faults, until every request got its answer and every order
	// reached B: no row left unsent, nothing left in the broker.
	settled := func() bool {
		select {
		case <-clientsDone:
		default:
			return false
		}
		var unsent, effects int
		poolA.QueryRow(ctx, `SELECT count(*) FROM idem_outbox WHERE sent_at IS NULL`).Scan(&unsent)
		poolB.QueryRow(ctx, `SELECT count(DISTINCT key) FROM effects`).Scan(&effects)
		return unsent == 0 && effects >= requests && drained()
	}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	deadline := time.Now().Add(waitTimeout)
	for !settled() {
		if time.Now().After(deadline) {
			var unsent, effects int
			poolA.QueryRow(ctx, `SELECT count(*) FROM idem_outbox WHERE sent_at IS NULL`).Scan(&unsent)
			poolB.QueryRow(ctx, `SELECT count(DISTINCT key) FROM effects`).Scan(&effects)
			t.Fatalf("not settled within %v: %d of %d requests answered, %d rows unsent, %d orders with an effect", waitTimeout, c.Acknowledged.Load(), requests, unsent, effects)
		}
		time.Sleep(100*time.Millisecond + time.Duration(rng.IntN(150))*time.Millisecond) // the time between two faults
		if !faulty {
			continue
		}
		if rng.IntN(5) == 0 {
			children[rng.IntN(len(children))].kill()
			continue
		}
		h := hops[rng.IntN(len(hops))]
		h.faults++
		if rng.IntN(2) == 0 {
			name := h.px.AddToxic(t, "reset_peer", []string{"upstream", "downstream"}[rng.IntN(2)], map[string]any{"timeout": 0})
			time.Sleep(50 * time.Millisecond) // the reset window
			h.px.RemoveToxic(t, name)
		} else {
			h.px.Disable()
			time.Sleep(100 * time.Millisecond) // the cut
			h.px.Enable(t)
		}
	}
	for _, s := range children {
		s.stop()
	}

	orders, orderDup := perKey(t, poolA, `SELECT key, count(*) FROM orders GROUP BY key`)
	rows, rowDup := perKey(t, poolA, `SELECT key, count(*) FROM idem_outbox GROUP BY key`)
	effects, effectDup := perKey(t, poolB, `SELECT key, count(*) FROM effects GROUP BY key`)
	var confirmed int
	keys, err := ctl.Keys(ctx, "ob:sent:*").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		n, _ := ctl.Get(ctx, k).Int()
		confirmed += n
	}
	c.Executed.Store(int64(orders + orderDup))
	c.Effects.Store(int64(effects + effectDup))
	c.Duplicated.Store(int64(effectDup))
	c.Lost.Store(int64(requests - effects))
	figures := map[string]string{
		"orders":          fmt.Sprintf("%d (%d duplicated)", orders, orderDup),
		"outbox_rows":     fmt.Sprintf("%d (%d duplicated)", rows, rowDup),
		"sends_confirmed": strconv.Itoa(confirmed),
		"kill_points":     fmt.Sprintf("relay %d, B %d", relay.stops.Load(), svcB.stops.Load()),
		"kills":           fmt.Sprintf("A %d, relay %d, B %d", svcA.kills.Load(), relay.kills.Load(), svcB.kills.Load()),
		"faults":          hopFaults(hops),
		"client_errors":   mapString(errKinds),
	}
	name, run := "outbox chain, "+kind, "TestOutboxChain"
	if !faulty {
		name, run = "outbox broker redelivery, "+kind, "TestOutboxBrokerRedelivery"
		delete(figures, "faults")
		delete(figures, "kills")
	}
	if mode == "control" {
		name += " (control: service B without dedup)"
	}
	chaostest.Report(t, name, "make chaos RUN="+run, &c, figures)

	switch {
	case c.Acknowledged.Load() != int64(requests):
		t.Errorf("answered: %d of %d", c.Acknowledged.Load(), requests)
	case orders != requests || orderDup != 0 || rows != requests || rowDup != 0:
		t.Errorf("service A: %d orders (%d duplicated), %d outbox rows (%d duplicated); want %d, 0, %d, 0", orders, orderDup, rows, rowDup, requests, requests)
	case effects != requests:
		t.Errorf("service B: effects for %d of %d orders", effects, requests)
	case mode == "gate" && effectDup != 0:
		t.Errorf("service B with its gate: %d duplicated effects, want 0", effectDup)
	case mode == "control" && effectDup == 0:
		t.Errorf("control: no duplicated effect; the scenario does not show what service B's deduplication prevents")
	case faulty && (relay.stops.Load() == 0 || svcB.stops.Load() == 0):
		t.Errorf("kill points reached: relay %d, B %d; want some of each", relay.stops.Load(), svcB.stops.Load())
	case !faulty && (relay.stops.Load() != 0 || svcB.stops.Load() == 0):
		t.Errorf("kill points reached: relay %d, B %d; want none and some", relay.stops.Load(), svcB.stops.Load())
	case !faulty && mode == "control" && int64(effectDup) < svcB.stops.Load():
		t.Errorf("control: %d duplicated effects, want at least one per kill of B (%d)", effectDup, svcB.stops.Load())
	}
}

// post sends one order request with key and returns the status.
func post(client *http.Client, url, key string) (int, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"order":"`+key+`"}`))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Idempotency-Key", key)
	req.Header.Set("Content-Type", "application/json")
	res, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	if _, err := io.Copy(io.Discard, res.Body); err != nil {
		return 0, err
	}
	return res.StatusCode, nil
}

// errKind names a client error for the figures.
func errKind(err error) string {
	s := err.Error()
	for _, k := range []string{"connection refused", "connection reset", "EOF", "timeout", "broken pipe"} {
		if strings.Contains(s, k) {
			return k
		}
	}
	var ne net.Error
	if errors.As(err, &ne) {
		return "network"
	}
	return "other"
}

// perKey runs query (key, count) and returns the keys and the rows beyond
// the first per key.
func perKey(t *testing.T, pool *pgxpool.Pool, query string) (keys, dup int) {
	t.Helper()
	rows, err := pool.Query(t.Context(), query)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		keys++
		dup += n - 1
	}
	return keys, dup
}

func hopFaults(hops []*hop) string {
	var parts []string
	for _, h := range hops {
		parts = append(parts, fmt.Sprintf("%s %d", h.name, h.faults))
	}
	return strings.Join(parts, ", ")
}

func mapString(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// hostOf returns the host:port of a Postgres URL.
func hostOf(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}

// viaProxy returns raw with its host replaced by the proxy's address.
func viaProxy(t *testing.T, raw string, h *hop) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	u.Host = h.px.Addr()
	return u.String()
}

// declareQueue declares a durable queue of the test's own on the shared
// RabbitMQ and deletes it, with the consumer's retry and dead-letter
// queues, when the test ends.
func declareQueue(t *testing.T) string {
	t.Helper()
	ch := amqpChannel(t)
	q := uniqueName("idem-chaos-chain-")
	if _, err := ch.QueueDeclare(q, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, name := range []string{q, q + ".retry", q + ".dlq"} {
			if _, err := ch.QueueDelete(name, false, false, false); err != nil {
				t.Errorf("cleanup: delete queue %s: %v", name, err)
			}
		}
	})
	return q
}

// streamBacklog returns the group's pending entries and those it has not
// read yet.
func streamBacklog(t *testing.T, rdb *redis.Client, stream string) int {
	t.Helper()
	groups, err := rdb.XInfoGroups(t.Context(), stream).Result()
	if err != nil || len(groups) != 1 {
		return -1 // no group yet
	}
	g := groups[0]
	undelivered := g.Lag
	if undelivered < 0 {
		rest, err := rdb.XRange(t.Context(), stream, "("+g.LastDeliveredID, "+").Result()
		if err != nil {
			t.Fatal(err)
		}
		undelivered = int64(len(rest))
	}
	return int(g.Pending + undelivered)
}
