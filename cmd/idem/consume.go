package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/cmd/idem/internal/brokersource"
	"github.com/idemgo/idem/cmd/idem/internal/brokerurl"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/delivery"
	"github.com/idemgo/idem/cmd/idem/internal/redact"
	"github.com/idemgo/idem/cmd/idem/internal/serving"
	"github.com/idemgo/idem/cmd/idem/internal/storeopen"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/sidecar"
	"github.com/idemgo/idem/idemproxy"
	"github.com/idemgo/idem/postgres/pggate"
)

// consumeConfig is the configuration of `idem consume`.
type consumeConfig struct {
	from, to        string
	toBatch         string
	store           storeFlags
	key             string
	lease           time.Duration
	retention       time.Duration
	handler         sidecar.Handler
	maxDeliveries   int
	concurrency     int
	parallel        int
	batch           int
	retryDelay      time.Duration
	retryMaxDelay   time.Duration
	passDuplicates  bool
	deadLetter      string
	gate            string
	scope           string
	name            string
	shutdownTimeout time.Duration
	adminListen     string
	logFormat       string
	logLevel        string

	broker  *brokerurl.URL   // --from, parsed
	keySpec delivery.KeySpec // --key, parsed
}

const consumeDoc = `
Reads messages from the broker at --from with idem's consumer (the same
algorithm as the Go adapters) and POSTs each one to the HTTP handler at
--to, in any language, at most once per idempotency key:

  redis-stream://[:PASSWORD@]HOST:PORT/STREAM?group=GROUP[&db=N]  (rediss-stream:// for TLS)
  kafka://HOST:PORT[,HOST:PORT...]/TOPIC?group=GROUP
  amqp://USER:PASSWORD@HOST:PORT/[VHOST/]QUEUE                   (amqps:// for TLS)
  nats://[USER:PASSWORD@]HOST:PORT/STREAM?consumer=DURABLE       (JetStream)
  sqs://HOST/ACCOUNT/QUEUE[?region=R][&insecure=true]            (the AWS SDK's default credentials)

Each request carries the message's body as received and the headers
Idempotency-Key, Idempotency-Digest (the scoped key's digest), Idempotency-Fence (grows with every acquisition of the
key: a handler that stores it with its effect and refuses a write whose
fence is not above the stored one keeps out a stale owner after a
takeover; for one effect per key also when an answer or a record is lost,
see --gate), Idem-Broker, Idem-Topic,
Idem-Message-Id, Idem-Partition and Idem-Offset (Kafka), Idem-Deliveries,
and the message's traceparent and tracestate; its other headers (a Redis
stream entry's other fields) as Idem-Header-NAME.

The handler's answer decides, and the message is acknowledged only after
the decision is recorded: a 2xx completes the key (the response's status,
headers and body up to --max-result are the stored result) and acks the
message; a 4xx other than 408, 409 and 429 is terminal: the message is
dead-lettered (the status and the start of the body in the dead letter's
error); a refused, reset or closed connection (the handler died or
restarts) sends the same request, with the same fence, again (after 10ms,
doubling up to 1s) until the handler answers or --handler-timeout passes
(with --gate, not once the key's completion row committed); a 5xx, 408,
409, 429 or no answer within --handler-timeout release the key and the
message is delivered again after
--retry-delay (doubled with each delivery up to --retry-max-delay, if set), then dead-lettered after --max-deliveries. While the handler
runs, the key's lease is extended; if it is lost anyway, the request is
cancelled (its connection closed) and --on-lease-lost, if set, gets a POST
of {"scope","key","fence","reason"}. A message whose key was completed
before is acked without calling the handler (--pass-duplicates calls it
with Idempotent-Replayed: true and no fence).

Keys (--key): id is the broker's message ID (a stream entry ID, a Kafka
PARTITION-OFFSET, a JetStream stream sequence, an SQS message ID, an AMQP
message-id property), the same on every redelivery of one message but not
across two sends of it; header:NAME is a message header (a Redis stream
entry's field, a Kafka record header, an AMQP header, a NATS header, an SQS
string attribute); json:POINTER is a member of a JSON body (an RFC 6901
pointer: json:/id, json:/data/object/id); hash:POINTER,POINTER… is the
SHA-256 of those members of a JSON body (for payloads that carry no key but
whose listed members identify the operation). The default is the broker's
adapter's, where idem relay --outbox writes the key: the field "key" of a
stream entry, the header Idempotency-Key (Kafka), the message-id property
(AMQP), the header Nats-Msg-Id (NATS), the attribute idempotency-key (SQS).
A message without a key is dead-lettered at once.

The records live in Redis (--redis, --redis-cluster, --redis-sentinel) or
PostgreSQL (--postgres), never in the embedded store: every broker here
lets a second consumer (another replica, a pod restarted on another node)
read the same messages, and a second sidecar with its own embedded store
would run them again. A Redis stream's records must live on the stream's
server (the key is completed and the entry acked in one script): without a
store flag they do.

Each batch of --batch messages is acquired in one store call, its calls
to the handler run --parallel at a time (the default 1: one at a time, in
the broker's order); each key is completed as soon as its call answered
(the calls that answer meanwhile share one store call; a Redis stream's
entry is acked with it), the batch's other messages acked once every call
answered. A batch's keys are distinct (a repeat of a key
waits for the first), so --parallel never runs one key twice at once; it
only gives up the order between distinct keys. --concurrency batches run
at once.

With --gate postgres://…, the handler can make its effect happen once
per key even when the store loses a record: in the transaction of its
effect it inserts the key's completion row with one statement (its
parameters are the headers Idempotency-Digest, Idempotency-Fence and
Idem-Retention; docs/consume.md has it) and rolls back when the statement
changed no row (answering 409). Before each call consume looks the row up:
a key whose row committed is acked without a call, the row's result stored
as its result.

With --to-batch URL instead of --to, each batch is one request: a POST
of a JSON array with one object per message that runs, in the broker's
order: {"key","fence","replayed","headers","body","encoding"}, where
headers holds what the message's own request would carry as headers
(Idempotency-Key, Idempotency-Fence, Idempotency-Digest, Idem-Broker,
traceparent, …; one value each), body is the message's body as a string
when encoding is "text", in base64 when it is "base64"; fence is absent
for a duplicate passed on (replayed true). The handler answers 2xx with a
JSON array of as many outcomes, in the same order:
{"status","headers","body","encoding"} (headers, body and encoding
optional; encoding "text" or "base64"), and each message is decided by its
outcome as by the answer to a request of its own (above). An answer that
is not a 2xx is every message's answer; a 2xx that is not valid JSON, or
has another count of outcomes, a status outside 100..599 or a bad
encoding, is logged and every message of the batch is retried; a broken
connection sends the request again with the same fences; --handler-timeout
bounds the whole request, and a lease lost (or a stop) cancels it for
every message of it. --parallel does not apply. docs/consume.md has the
protocol and handler examples.

On SIGTERM or SIGINT, consume stops fetching, lets the handlers in flight
finish for up to --shutdown-timeout (then cancels them; their messages are
delivered again), and exits. With --admin-listen it serves /healthz,
/readyz (503 while stopping or while the store's check fails) and /metrics.

Unless the environment sets GOGC, consume runs Go's garbage collector at
GOGC=400 rather than 100: less CPU per message for about 10 MiB more
resident memory. GOGC=100 restores the runtime's default.`

func consumeCommand() *command {
	return &command{
		name:    "consume",
		args:    "--from URL --to URL [flags]",
		summary: "hand each message of a broker to an HTTP handler, once per key",
		doc:     consumeDoc,
		flags: func(fs *cli.Set) func(context.Context, *env, []string) error {
			c := registerConsumeFlags(fs)
			return func(ctx context.Context, e *env, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("consume: unexpected argument %q (boolean flags take the form --pass-duplicates=true)", args[0])
				}
				return runConsume(ctx, e, c)
			}
		},
	}
}

func registerConsumeFlags(fs *cli.Set) *consumeConfig {
	c := &consumeConfig{
		lease: adapterkit.DefaultLease, retention: adapterkit.DefaultRetention,
		maxDeliveries: 5, concurrency: 1, parallel: 1, batch: 10, retryDelay: time.Second,
		shutdownTimeout: 30 * time.Second, logFormat: "text", logLevel: "info",
	}
	c.handler.Timeout, c.handler.MaxResult = sidecar.DefaultTimeout, sidecar.DefaultMaxResult
	defs := []cli.Def{
		{Name: "from", Placeholder: "URL", Value: cli.String(&c.from), Secret: cli.URLSecret, Usage: "the broker and what to read (see above); required"},
		{Name: "to", Placeholder: "URL", Value: cli.String(&c.handler.URL), Secret: cli.URLSecret, Usage: "the handler each message is POSTed to, e.g. http://127.0.0.1:9000/messages; required"},
		{Name: "to-batch", Placeholder: "URL", Value: cli.String(&c.toBatch), Secret: cli.URLSecret, Usage: "instead of --to: the handler each batch is POSTed to in one request, a JSON array of its messages, answered by a JSON array of their outcomes (see above)"},
		{Name: "key", Placeholder: "SOURCE", Value: cli.String(&c.key), Usage: "where the idempotency key is: id, header:NAME, json:POINTER or hash:POINTER,POINTER… (empty: the broker's default; see above)"},
	}
	for _, d := range c.store.flags() {
		if d.Name != "data" { // the embedded store is refused (see above)
			defs = append(defs, d)
		}
	}
	defs = append(defs, c.store.proxyFlags()...)
	defs = append(defs, []cli.Def{
		{Name: "lease", Placeholder: "DURATION", Value: cli.Duration(&c.lease), Usage: "how long a message holds its key before another consumer may take it over; extended while the handler runs"},
		{Name: "retention", Placeholder: "DURATION", Value: cli.Duration(&c.retention), Usage: "how long completed keys are kept (a duplicate within it is acked without a call)"},
		{Name: "handler-timeout", Placeholder: "DURATION", Value: cli.Duration(&c.handler.Timeout), Usage: "how long one call to the handler may take, its tries again after a broken connection included; then it is cancelled and the message retried"},
		{Name: "max-result", Placeholder: "SIZE", Value: cli.Size(&c.handler.MaxResult), Usage: "the part of a 2xx response's body stored as the key's result"},
		{Name: "max-deliveries", Placeholder: "N", Value: cli.Int(&c.maxDeliveries), Usage: "deliveries of a failing message before it is dead-lettered (0: retry forever)"},
		{Name: "retry-delay", Placeholder: "DURATION", Value: cli.Duration(&c.retryDelay), Usage: "delay before a failed message is delivered again (a Redis stream: at least --lease, the claim idle time)"},
		{Name: "retry-max-delay", Placeholder: "DURATION", Value: cli.Duration(&c.retryMaxDelay), Usage: "exponential backoff: the delay after a failed call doubles with each delivery, up to this (NATS, RabbitMQ, SQS; 0: every retry after --retry-delay)"},
		{Name: "concurrency", Placeholder: "N", Value: cli.Int(&c.concurrency), Usage: "batches handled at the same time (a Redis stream: N consumers of the group)"},
		{Name: "batch", Placeholder: "N", Value: cli.Int(&c.batch), Usage: "messages fetched, acquired and completed together (acked once every call of the batch answered)"},
		{Name: "parallel", Placeholder: "N", Value: cli.Int(&c.parallel), Usage: "calls to the handler of one batch at the same time (a batch's keys are distinct, so one key's messages never run at once; 1: one at a time, in the broker's order)"},
		{Name: "pass-duplicates", Value: cli.Bool(&c.passDuplicates), Usage: "call the handler for a duplicate of a completed key too, with Idempotent-Replayed: true (its answer only delays the ack)"},
		{Name: "on-lease-lost", Placeholder: "URL", Value: cli.String(&c.handler.LeaseLostURL), Secret: cli.URLSecret, Usage: "POST {\"scope\",\"key\",\"fence\",\"reason\"} here when a handler's lease was lost (another consumer runs the message again)"},
		{Name: "dead-letter", Placeholder: "NAME", Value: cli.String(&c.deadLetter), Usage: "where dead letters go: a stream, topic, queue, subject or SQS queue URL (empty: the adapter's default, STREAM:dlq for a Redis stream)"},
		{Name: "gate", Placeholder: "URL", Value: cli.String(&c.gate), Secret: cli.URLSecret, Usage: "postgres://… of the handler's database: a key whose completion row the handler committed there (docs/consume.md) is acked without a call; its table is created if missing (empty: off)"},
		{Name: "scope", Placeholder: "SCOPE", Value: cli.String(&c.scope), Usage: "scope of the keys (empty: the stream, topic, queue or JetStream stream)"},
		{Name: "name", Placeholder: "NAME", Value: cli.String(&c.name), Usage: "this consumer's name in a Redis stream's group (empty: HOSTNAME-PID)"},
		{Name: "shutdown-timeout", Placeholder: "DURATION", Value: cli.Duration(&c.shutdownTimeout), Usage: "how long a shutdown waits for the handlers in flight"},
		{Name: "admin-listen", Placeholder: "ADDR", Value: cli.String(&c.adminListen), Usage: "address for /metrics, /healthz and /readyz (empty: off)"},
		{Name: "log-format", Placeholder: "FORMAT", Value: cli.String(&c.logFormat), Usage: "log format: text or json"},
		{Name: "log-level", Placeholder: "LEVEL", Value: cli.String(&c.logLevel), Usage: "log level: debug, info, warn or error"},
	}...)
	fs.Define(defs...)
	return c
}

// validate checks the flags without I/O and parses --from.
func (c *consumeConfig) validate() error {
	if c.toBatch != "" {
		if c.handler.URL != "" {
			return cli.Usagef("consume: give --to or --to-batch, not both")
		}
		if c.parallel != 1 {
			return cli.Usagef("consume: --parallel does not apply to --to-batch: every message of a batch is in its one request")
		}
		c.handler.URL, c.handler.Batch = c.toBatch, true
	}
	if c.from == "" || c.handler.URL == "" {
		return cli.Usagef("consume: --from and --to (or --to-batch) are required (e.g. --from 'redis-stream://127.0.0.1:6379/orders?group=billing' --to http://127.0.0.1:9000/messages)")
	}
	b, err := brokerurl.Parse("--from", c.from)
	if err != nil {
		return cli.Usagef("consume: %v", err)
	}
	c.broker = b
	if err := c.handler.Check(); err != nil {
		return cli.Usagef("consume: invalid --to or --on-lease-lost: %v", err)
	}
	_, levelErr := parseLevel(c.logLevel)
	return cli.FirstError(
		c.store.validate(),
		cli.Check(!c.store.redis() && c.store.postgres == "" && b.Kind != "redis-stream",
			"consume: the embedded store is refused: a second consumer of %s (another replica, a pod restarted elsewhere) would run the messages again with its own records; give --redis, --redis-cluster, --redis-sentinel or --postgres", b.Where),
		cli.Check(b.Kind == "redis-stream" && c.store.postgres != "", "consume: a Redis stream's records live on its Redis server (the key is completed and the entry acked in one script): drop --postgres"),
		cli.Check(b.Kind == "redis-stream" && b.Query.Get("group") == "", "consume: --from %s has no group: add ?group=NAME", redact.URL(c.from)),
		cli.Check(b.Kind == "amqp" && b.Exchange != "", "consume: --from %s names an exchange (routing-key=): consume reads a queue", redact.URL(c.from)),
		checkAddr("--admin-listen", c.adminListen),
		cli.Check(c.lease < time.Millisecond, "--lease %v is too short", c.lease),
		cli.Check(c.retention < c.lease, "--retention %v is shorter than --lease %v", c.retention, c.lease),
		cli.Check(c.handler.Timeout <= 0, "--handler-timeout must be positive"),
		cli.Check(c.maxDeliveries < 0, "--max-deliveries %d is negative", c.maxDeliveries),
		cli.Check(c.concurrency < 1, "--concurrency %d must be at least 1", c.concurrency),
		cli.Check(c.batch < 1 || c.batch > 10000, "--batch %d is not in 1..10000", c.batch),
		cli.Check(c.parallel < 1 || c.parallel > c.batch, "--parallel %d is not in 1..--batch (%d)", c.parallel, c.batch),
		cli.Check(c.retryDelay < 0, "--retry-delay %v is negative", c.retryDelay),
		cli.Check(c.retryMaxDelay < 0, "--retry-max-delay %v is negative", c.retryMaxDelay),
		cli.Check(c.shutdownTimeout <= 0, "--shutdown-timeout must be positive"),
		cli.Check(c.logFormat != "text" && c.logFormat != "json", "invalid --log-format %q: want text or json", c.logFormat),
		levelErr,
		c.parseKey(),
		cli.Check(b.Kind == "sqs" && c.deadLetter == "", "consume: an SQS queue has no default dead-letter queue: give --dead-letter QUEUE-URL"),
	)
}

func (c *consumeConfig) parseKey() error {
	k, err := delivery.ParseKeySpec(c.key)
	c.keySpec = k
	return err
}

// options are the consumer options every broker gets.
func (c *consumeConfig) options(log *slog.Logger) []consumer.Option {
	opts := []consumer.Option{
		consumer.WithMaxDeliveries(c.maxDeliveries), consumer.WithRetryDelay(c.retryDelay), consumer.WithRetryBackoff(c.retryMaxDelay),
		consumer.WithBatchSize(c.batch), consumer.WithParallelHandlers(c.parallel), consumer.WithShutdownTimeout(c.shutdownTimeout),
		consumer.WithLogger(log), consumer.WithOnLeaseLost(c.handler.OnLeaseLost),
	}
	if c.passDuplicates {
		opts = append(opts, consumer.WithPassDuplicates())
	}
	if c.handler.Batch {
		// The batch's calls are its one request: they all answer at
		// once, and one commit call completes them (completing each as it
		// returns made one call for nearly every message, as each
		// handler found none under way).
		opts = append(opts, consumer.WithGatheredHandlers())
	} else {
		// A sidecar killed mid-batch leaves only its calls in flight to be
		// made again (docs/consume.md, the fence check).
		opts = append(opts, consumer.WithCompleteEach())
	}
	if c.deadLetter != "" && c.broker.Kind != "sqs" { // SQS: New's argument
		opts = append(opts, consumer.WithDeadLetter(c.deadLetter))
	}
	scope := c.scope
	if scope == "" {
		scope = c.broker.Target
	}
	return append(opts, consumer.WithScope(scope))
}

// consumeGOGC is idem consume's garbage-collection target when the
// environment sets no GOGC: the sidecar's live heap is a few MiB and
// nearly everything it allocates is garbage by the end of its batch, so
// the default target (100) collects several times a batch; at 400 it
// spends less of its CPU collecting (BENCHMARKS.md, idem consume) for
// about 10 MiB more resident memory. GOGC in the environment (the Go
// runtime's own variable, off included) overrides it.
const consumeGOGC = 400

// consumeGC sets the garbage collector's target to consumeGOGC unless
// the environment sets GOGC.
func consumeGC(getenv func(string) string) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(consumeGOGC)
	}
}

// runConsume runs `idem consume`.
func runConsume(ctx context.Context, e *env, c *consumeConfig) error {
	if err := c.validate(); err != nil {
		return err
	}
	consumeGC(e.getenv)
	log := redact.Logger(newLogger(e, c.logFormat, c.logLevel), e.hider)
	redisLog.l.Store(log)
	c.store.logger = log
	c.handler.Logger = log
	c.handler.Conns = max(64, c.concurrency*c.parallel)
	if c.name == "" {
		host, _ := os.Hostname()
		c.name = fmt.Sprintf("%s-%d", host, os.Getpid())
	}
	st, err := c.openStore(ctx)
	if err != nil {
		return err
	}
	defer closeStore(st, log)
	reg, execMetrics := newRegistry(st.Store)
	exec, err := idem.New(st.Store, idem.WithLease(c.lease), idem.WithRetention(c.retention),
		idem.WithMaxResultSize(c.handler.MaxResult+64<<10), idem.WithObserver(execMetrics.Observe))
	if err != nil {
		return cli.Usagef("%v", err)
	}
	if c.gate != "" {
		closeGate, err := c.openGate(ctx, exec, log)
		if err != nil {
			return err
		}
		defer closeGate()
	}
	src, err := (&brokersource.Config{
		Broker: c.broker, Key: c.keySpec, Handler: &c.handler, Options: c.options(log), Concurrency: c.concurrency,
		Name: c.name, Scope: c.scope, DeadLetter: c.deadLetter, Lease: c.lease, Redis: st.Redis,
	}).Open(ctx, exec)
	if err != nil {
		return err
	}
	defer src.Close()
	registerConsumeStats(reg, src.Stats)

	var draining atomic.Bool
	var admin *http.Server
	started := []any{"from", c.broker.Where, "to", redact.URL(c.handler.URL), "batch_requests", c.handler.Batch, "store", st.Describe,
		"batch", c.batch, "parallel", c.parallel, "concurrency", c.concurrency, "max_deliveries", c.maxDeliveries,
		"lease", cli.FormatDuration(c.lease), "handler_timeout", cli.FormatDuration(c.handler.Timeout)}
	if c.adminListen != "" {
		ln, err := net.Listen("tcp", c.adminListen)
		if err != nil {
			return fmt.Errorf("cannot listen on %s (--admin-listen): %v", c.adminListen, cli.Cause(err))
		}
		admin = &http.Server{Handler: consumeAdmin(reg, st, &draining), ReadHeaderTimeout: 10 * time.Second}
		go admin.Serve(ln)
		started = append(started, "admin", ln.Addr().String())
	}
	log.Info("idem consume started", started...)
	err = src.Run(ctx)
	draining.Store(true)
	s := src.Stats()
	log.Info("idem consume stopped", "processed", s.Processed, "replayed", s.Replayed, "retried", s.Retried,
		"dead_lettered", s.DeadLettered, "invalid", s.Invalid, "panics", s.Panics, "errors", s.Errors, "abandoned", s.Abandoned)
	if admin != nil {
		sctx, cancel := context.WithTimeout(context.Background(), time.Second)
		admin.Shutdown(sctx)
		cancel()
	}
	return err
}

// registerConsumeStats registers the consumers' statistics (consumer.Stats)
// in /metrics: idem_consume_messages_total, one series per outcome, and
// idem_consume_broker_errors_total.
func registerConsumeStats(reg *prometheus.Registry, stats func() consumer.Stats) {
	for outcome, get := range map[string]func(consumer.Stats) int64{
		"processed":     func(s consumer.Stats) int64 { return s.Processed },
		"replayed":      func(s consumer.Stats) int64 { return s.Replayed },
		"retried":       func(s consumer.Stats) int64 { return s.Retried },
		"dead_lettered": func(s consumer.Stats) int64 { return s.DeadLettered },
		"invalid":       func(s consumer.Stats) int64 { return s.Invalid },
		"panics":        func(s consumer.Stats) int64 { return s.Panics },
		"redelivered":   func(s consumer.Stats) int64 { return s.Redelivered },
		"abandoned":     func(s consumer.Stats) int64 { return s.Abandoned },
	} {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "idem_consume_messages_total",
			Help:        "Messages of idem consume by outcome (the consumer's statistics; a message may count in several).",
			ConstLabels: prometheus.Labels{"outcome": outcome},
		}, func() float64 { return float64(get(stats())) }))
	}
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "idem_consume_broker_errors_total",
		Help: "Broker calls of idem consume that failed (an acknowledgement, a dead-letter write, a fetch).",
	}, func() float64 { return float64(stats().Errors) }))
}

// openGate opens the commit gate's completion table at --gate (created
// if missing) for the handler's checks. The gate's relay is off: the rows
// the handler inserts are marked relayed, and the rows of other gates on
// the table are their own gates' to relay; its janitor deletes expired
// rows.
func (c *consumeConfig) openGate(ctx context.Context, exec *idem.Executor, log *slog.Logger) (func(), error) {
	pool, describe, err := storeopen.Pool(ctx, "--gate", c.gate)
	if err != nil {
		return nil, err
	}
	g, err := pggate.New(exec, pool, pggate.WithRelayInterval(0), pggate.WithLogger(log))
	if err != nil {
		pool.Close()
		return nil, fmt.Errorf("--gate: %v", err)
	}
	if err := g.Migrate(ctx); err != nil {
		g.Close()
		pool.Close()
		return nil, fmt.Errorf("--gate %s: %v", describe, err)
	}
	c.handler.Gate = g
	return func() { g.Close(); pool.Close() }, nil
}

// openStore opens the records' store; for a Redis stream without a store
// flag, on the stream's server.
func (c *consumeConfig) openStore(ctx context.Context) (*openedStore, error) {
	b := c.broker
	if b.Kind != "redis-stream" {
		return c.store.open(ctx, true)
	}
	if !c.store.redis() {
		return c.store.openRedis(ctx, redis.NewClient(b.Redis), fmt.Sprintf("redis %s db %d", b.Redis.Addr, b.Redis.DB))
	}
	if c.store.target.URL != "" {
		opt, _ := redis.ParseURL(c.store.target.URL) // validated
		if opt.Addr != b.Redis.Addr || opt.DB != b.Redis.DB {
			return nil, cli.Usagef("consume: the records of Redis stream %s must live on its server (the key is completed and the entry acked in one script): --redis is %s db %d, the stream is on %s db %d; drop --redis or make them one",
				b.Target, opt.Addr, opt.DB, b.Redis.Addr, b.Redis.DB)
		}
	}
	// --redis-cluster, --redis-sentinel: the stream is read through the
	// store's client, on the server that holds the records.
	return c.store.open(ctx, false)
}

// consumeAdmin serves /healthz, /readyz (503 while draining or while the
// store's last check failed) and /metrics.
func consumeAdmin(reg *prometheus.Registry, st *openedStore, draining *atomic.Bool) http.Handler {
	return serving.AdminMux(reg, func(context.Context) error {
		if draining.Load() {
			return idemproxy.ErrDraining
		}
		if st.Health != nil {
			return st.Health()
		}
		return nil
	})
}
