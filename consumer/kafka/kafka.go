package kafka

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Handler processes one record. ctx carries the idempotency lease
// (idem.FenceFrom) and is cancelled when the lease is lost, when the
// record's partition is revoked from this member, or when a graceful
// shutdown runs out of time. A nil error completes the record's key; an
// error releases it and the record is redelivered (see WithMaxDeliveries).
type Handler func(ctx context.Context, r *kgo.Record) error

// KeyFunc returns the idempotency key of a record; "" means the record has
// none (it is dead-lettered at once).
type KeyFunc func(r *kgo.Record) string

// KeyHeader returns a KeyFunc that reads the key from the record header
// name (the first header with that name).
func KeyHeader(name string) KeyFunc {
	return func(r *kgo.Record) string {
		for _, h := range r.Headers {
			if h.Key == name {
				return string(h.Value)
			}
		}
		return ""
	}
}

// KeyField returns a KeyFunc that reads the key from the top-level field
// name of the record's JSON value (consumer.JSONField).
func KeyField(name string) KeyFunc {
	return func(r *kgo.Record) string { return consumer.JSONField(r.Value, name) }
}

// KeyHash returns a KeyFunc whose key is the SHA-256 of the listed
// top-level fields of the record's JSON value (consumer.JSONHash): for
// payloads with no key of their own whose listed fields identify the
// operation.
func KeyHash(fields ...string) KeyFunc {
	return func(r *kgo.Record) string { return consumer.JSONHash(r.Value, fields...) }
}

// Defaults of the options.
const (
	DefaultScope           = "kafka"
	DefaultMaxDeliveries   = 5
	DefaultRetryDelay      = time.Second
	DefaultBatchSize       = 100
	DefaultConcurrency     = 16
	DefaultShutdownTimeout = 30 * time.Second
	DefaultDLQSuffix       = ".dlq"
	// DefaultKeyHeader is the record header that holds the idempotency
	// key by default.
	DefaultKeyHeader = "Idempotency-Key"
)

// Header names added to dead-lettered records, after the original headers.
const (
	HeaderError      = "idem-error"
	HeaderTopic      = "idem-topic"
	HeaderPartition  = "idem-partition"
	HeaderOffset     = "idem-offset"
	HeaderDeliveries = "idem-deliveries"
)

// Option configures a Consumer: the options of package consumer shared by
// every adapter (consumer.WithScope, consumer.WithMaxDeliveries,
// consumer.WithRetryDelay, consumer.WithBatchSize, consumer.WithConcurrency,
// consumer.WithShutdownTimeout, consumer.WithDeadLetter,
// consumer.WithLogger, consumer.WithEventHook, consumer.WithOnLeaseLost,
// consumer.WithPassDuplicates) and this package's own.
//
// For Kafka: the default scope is DefaultScope ("kafka"); the batch size
// is how many records of one partition go to the Processor at once (a poll
// takes up to the batch size times the concurrency records), default
// DefaultBatchSize (100); the concurrency is how many partitions' batches
// are processed at the same time, default DefaultConcurrency (16); the
// dead-letter destination is a topic, default the record's topic followed
// by ".dlq". Kafka keeps no delivery count, so the count is the larger of
// the handler runs this member saw (in memory) and the acquisitions of the
// record's key in the store, which a restart or a rebalance does not
// reset. After a failure a partition waits the retry delay before the
// record is delivered again.
type Option = consumer.Option

type config struct {
	key         KeyFunc
	keySet      int
	fingerprint func(*kgo.Record) string
}

// WithKeyHeader takes the idempotency key from the record header name (the
// first header with that name). The default is DefaultKeyHeader
// ("Idempotency-Key"); a record without it is dead-lettered.
func WithKeyHeader(name string) Option {
	return consumer.AdapterOption(func(c *config) {
		c.keySet++
		c.key = nil
		if name != "" {
			c.key = KeyHeader(name)
		}
	})
}

// WithKeyFunc takes the idempotency key from f, for example KeyField or
// KeyHash. The default is the header DefaultKeyHeader. f must be safe for
// concurrent use.
func WithKeyFunc(f KeyFunc) Option {
	return consumer.AdapterOption(func(c *config) { c.keySet++; c.key = f })
}

// WithRecordKey takes the idempotency key from the record key. It is safe
// only when producers give every operation a record key of its own (a
// UUID per event). Record keys are usually partition keys (a customer, an
// account): then a second, different event with the same record key within
// the retention is acknowledged as a duplicate and its handler never runs.
// It is not the default for that reason.
func WithRecordKey() Option {
	return WithKeyFunc(func(r *kgo.Record) string { return string(r.Key) })
}

// WithFingerprint sets a function that identifies a record's payload: a
// record whose key was used before with another fingerprint is
// dead-lettered with idem.ErrMismatch. The default is no fingerprint.
func WithFingerprint(f func(r *kgo.Record) string) Option {
	return consumer.AdapterOption(func(c *config) { c.fingerprint = f })
}

// Stats are the counters of a Consumer: consumer.Stats, the one type of
// every adapter, counted by its Processor. Errors counts failed
// dead-letter produces (the record is retried) and failed commits.
type Stats = consumer.Stats

type tp struct {
	topic     string
	partition int32
}

// part is an assigned partition.
type part struct {
	ctx        context.Context
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	revoked    bool
	deliveries map[int64]int // offset → deliveries, reset on revoke
}

// Consumer consumes a consumer group with franz-go and runs its handler at
// most once per idempotency key. Create it with New, run it with Run. Its
// methods are safe for concurrent use.
type Consumer struct {
	cl     *kgo.Client
	proc   *consumer.Processor
	h      Handler
	cfg    config
	shared consumer.Config
	dlq    func(topic string) string

	mu      sync.Mutex
	parts   map[tp]*part
	crashed atomic.Bool        // test hook: skip every acknowledgement
	ran     atomic.Bool        // Run was called
	resumes map[tp]*time.Timer // pending resumes of rewound partitions
}

// New returns a Consumer that runs h for the records of the consumer group
// configured in kopts (kgo.ConsumerGroup and kgo.ConsumeTopics are
// required). New adds kgo.AutoCommitMarks and its own OnPartitionsAssigned,
// OnPartitionsRevoked and OnPartitionsLost callbacks to kopts; do not set
// those, nor kgo.DisableAutoCommit or kgo.BlockRebalanceOnPoll. Errors
// wrap idem.ErrInvalid for a bad configuration.
func New(kopts []kgo.Opt, exec *idem.Executor, h Handler, opts ...Option) (*Consumer, error) {
	c := &Consumer{
		h:       h,
		parts:   make(map[tp]*part),
		resumes: make(map[tp]*time.Timer),
	}
	proc, shared, err := consumer.Setup(exec, consumer.Config{
		Scope:           DefaultScope,
		MaxDeliveries:   DefaultMaxDeliveries,
		RetryDelay:      DefaultRetryDelay,
		BatchSize:       DefaultBatchSize,
		Concurrency:     DefaultConcurrency,
		ShutdownTimeout: DefaultShutdownTimeout,
	}, &c.cfg, opts)
	if err != nil {
		return nil, err
	}
	cfg := &c.cfg
	switch {
	case h == nil:
		return nil, fmt.Errorf("%w: kafka: nil handler", idem.ErrInvalid)
	case cfg.keySet > 0 && cfg.key == nil:
		return nil, fmt.Errorf("%w: kafka: empty key header name or nil key function", idem.ErrInvalid)
	case cfg.keySet > 1:
		return nil, fmt.Errorf("%w: kafka: WithKeyHeader and WithKeyFunc are exclusive", idem.ErrInvalid)
	}
	if cfg.key == nil {
		cfg.key = KeyHeader(DefaultKeyHeader)
	}
	c.proc, c.shared = proc, shared
	c.dlq = func(topic string) string { return topic + DefaultDLQSuffix }
	if shared.DeadLetter != "" {
		c.dlq = func(string) string { return shared.DeadLetter }
	}
	all := append([]kgo.Opt(nil), kopts...)
	all = append(all,
		kgo.AutoCommitMarks(),
		kgo.OnPartitionsAssigned(c.assigned),
		kgo.OnPartitionsRevoked(c.revoked),
		kgo.OnPartitionsLost(c.lost),
	)
	cl, err := kgo.NewClient(all...)
	if err != nil {
		return nil, fmt.Errorf("%w: kafka: %w", idem.ErrInvalid, err)
	}
	var bad string
	switch {
	case cl.OptValue(kgo.ConsumerGroup) == "":
		bad = "kgo.ConsumerGroup is required"
	case cl.OptValue(kgo.DisableAutoCommit) == true:
		bad = "kgo.DisableAutoCommit is not supported: completed records are committed through AutoCommitMarks"
	case cl.OptValue(kgo.BlockRebalanceOnPoll) == true:
		bad = "kgo.BlockRebalanceOnPoll is not supported: revoked partitions cancel their handlers instead"
	}
	if bad != "" {
		cl.Close()
		return nil, fmt.Errorf("%w: kafka: %s", idem.ErrInvalid, bad)
	}
	c.cl = cl
	return c, nil
}

// Client returns the franz-go client, for producing or admin requests. Do
// not poll, commit or close it: Run does.
func (c *Consumer) Client() *kgo.Client { return c.cl }

// Stats returns a snapshot of the counters.
func (c *Consumer) Stats() Stats { return c.proc.Stats() }

func (c *Consumer) assigned(_ context.Context, _ *kgo.Client, m map[string][]int32) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for topic, ps := range m {
		for _, p := range ps {
			k := tp{topic, p}
			if _, ok := c.parts[k]; ok {
				continue
			}
			ctx, cancel := context.WithCancel(context.Background())
			c.parts[k] = &part{ctx: ctx, cancel: cancel, deliveries: make(map[int64]int)}
		}
	}
}

// drop cancels the handlers of the partitions in m and waits for their
// batches to end (a handler that ignores the cancellation is abandoned
// consumer.AbandonAfter later); their records are not marked after that.
func (c *Consumer) drop(m map[string][]int32) {
	var gone []*part
	c.mu.Lock()
	for topic, ps := range m {
		for _, p := range ps {
			k := tp{topic, p}
			if pt, ok := c.parts[k]; ok {
				pt.revoked = true
				pt.cancel()
				delete(c.parts, k)
				gone = append(gone, pt)
			}
		}
	}
	c.mu.Unlock()
	for _, pt := range gone {
		pt.wg.Wait()
	}
}

func (c *Consumer) revoked(ctx context.Context, cl *kgo.Client, m map[string][]int32) {
	c.drop(m)
	if c.crashed.Load() {
		return
	}
	// Commit what completed before the partitions go to another member.
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := cl.CommitMarkedOffsets(cctx); err != nil {
		c.proc.ReportError("commit on revoke", err)
	}
}

func (c *Consumer) lost(_ context.Context, _ *kgo.Client, m map[string][]int32) { c.drop(m) }

// rewind is a partition to deliver again from offset after delay.
type rewind struct {
	tp     tp
	part   *part
	offset int64
	epoch  int32
	delay  time.Duration
}

// Run polls and processes records until ctx is done or the client is
// closed, then shuts down gracefully: it stops fetching, waits up to the
// shutdown timeout for in-flight batches (then cancels them), commits the
// completed records, leaves the group and closes the client. A handler
// that ignores its context's cancellation is abandoned
// consumer.AbandonAfter later: its record is not committed, its key is
// left to its lease (the next member takes it over once the lease ended),
// and its goroutine runs on, after Run returned, until it returns; what it
// returns then is ignored. So Run returns within about the shutdown
// timeout plus consumer.AbandonAfter, plus the final commit. A Consumer
// runs once: a second call returns an error wrapping idem.ErrInvalid. Run
// returns nil after a shutdown through ctx.
func (c *Consumer) Run(ctx context.Context) error {
	if c.ran.Swap(true) {
		return fmt.Errorf("%w: kafka: Run called twice", idem.ErrInvalid)
	}
	work, stop := consumer.GraceContext(ctx, c.shared.ShutdownTimeout, errShutdownTimeout)
	defer stop()
	defer c.stopTimers()
	for ctx.Err() == nil && !c.crashed.Load() {
		fetches := c.cl.PollRecords(ctx, c.shared.BatchSize*c.shared.Concurrency)
		if fetches.IsClientClosed() {
			break
		}
		fetches.EachError(func(topic string, p int32, err error) {
			if !errors.Is(err, context.Canceled) {
				c.proc.ReportError(fmt.Sprintf("fetching %s/%d", topic, p), err)
			}
		})
		var batches []kgo.FetchTopicPartition
		fetches.EachPartition(func(p kgo.FetchTopicPartition) {
			if len(p.Records) > 0 {
				batches = append(batches, p)
			}
		})
		if len(batches) == 0 {
			continue
		}
		rewinds := make([]*rewind, len(batches))
		sem := make(chan struct{}, c.shared.Concurrency)
		var wg sync.WaitGroup
		for i, b := range batches {
			sem <- struct{}{}
			wg.Go(func() {
				defer func() { <-sem }()
				rewinds[i] = c.partition(work, b)
			})
		}
		wg.Wait()
		c.rewind(rewinds)
	}
	if c.crashed.Load() {
		// Test hook: die without acknowledging anything.
		c.cl.Close()
		return nil
	}
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	err := c.cl.CommitMarkedOffsets(cctx)
	cancel()
	c.cl.Close()
	if err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("kafka: final commit: %w", err)
	}
	return nil
}

// rewind seeks partitions back to their first unacknowledged record, paused
// for the retry delay, while no revoke runs (SetOffsets must not race one).
func (c *Consumer) rewind(rs []*rewind) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, r := range rs {
		if r == nil {
			continue
		}
		if c.parts[r.tp] != r.part || c.crashed.Load() {
			continue // revoked: the next owner starts at the committed offset
		}
		tps := map[string][]int32{r.tp.topic: {r.tp.partition}}
		c.cl.PauseFetchPartitions(tps)
		c.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{
			r.tp.topic: {r.tp.partition: {Epoch: r.epoch, Offset: r.offset}},
		})
		if t := c.resumes[r.tp]; t != nil {
			t.Stop()
		}
		var t *time.Timer
		t = time.AfterFunc(max(r.delay, time.Millisecond), func() {
			c.mu.Lock()
			if c.resumes[r.tp] == t {
				delete(c.resumes, r.tp)
			}
			c.mu.Unlock()
			c.cl.ResumeFetchPartitions(tps)
		})
		c.resumes[r.tp] = t
	}
}

// stopTimers stops the pending resumes of rewound partitions.
func (c *Consumer) stopTimers() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, t := range c.resumes {
		t.Stop()
		delete(c.resumes, k)
	}
}

// partition processes one partition's records of a poll, in batches of the
// batch size, in offset order, until one of them must be rewound.
func (c *Consumer) partition(work context.Context, p kgo.FetchTopicPartition) *rewind {
	for recs := p.Records; len(recs) > 0; {
		n := min(len(recs), c.shared.BatchSize)
		rw, more := c.batch(work, tp{p.Topic, p.Partition}, recs[:n])
		if !more {
			return rw
		}
		recs = recs[n:]
	}
	return nil
}

// batch processes records of one partition, in offset order, with one
// Processor call, and marks the records that are done. It returns where to
// rewind the partition, or whether to go on with the partition's next
// records.
func (c *Consumer) batch(work context.Context, k tp, records []*kgo.Record) (rw *rewind, more bool) {
	c.mu.Lock()
	pt, ok := c.parts[k]
	if !ok || pt.revoked {
		c.mu.Unlock()
		return nil, false // not (or no longer) ours
	}
	pt.wg.Add(1)
	msgs := make([]consumer.Message, len(records))
	for i, r := range records {
		msgs[i].Deliveries = pt.deliveries[r.Offset] + 1
	}
	c.mu.Unlock()
	defer pt.wg.Done()

	for i, r := range records {
		msgs[i].Key = c.cfg.key(r)
		if c.cfg.fingerprint != nil {
			msgs[i].Fingerprint = c.cfg.fingerprint(r)
		}
	}
	ctx, cancel := context.WithCancel(pt.ctx)
	defer cancel()
	defer context.AfterFunc(work, cancel)()
	// The handlers run on goroutines of their own, and an abandoned one
	// (consumer.ErrAbandoned) may still be running when Process returns.
	ran := make([]atomic.Bool, len(msgs))
	results := c.proc.Process(ctx, msgs, func(ctx context.Context, i int) error {
		ran[i].Store(true)
		return c.h(ctx, records[i])
	})

	var done []*kgo.Record
	for i, res := range results {
		r := records[i]
		if rw != nil {
			// Past the rewind point everything is delivered again, in
			// order; a record whose handler completed is replayed then.
			continue
		}
		if res.Action == consumer.DeadLetter {
			if err := c.deadLetter(ctx, r, res.Err, msgs[i].Deliveries); err != nil {
				c.proc.ReportError("dead-letter produce", err)
				res = consumer.Result{Action: consumer.Retry, Delay: c.shared.RetryDelay, Err: err}
			}
		}
		if res.Action == consumer.Retry {
			// The delay of a key in progress elsewhere is the rest of its
			// lease; the owner usually finishes sooner, and the partition
			// waits behind this record, so poll the key at least every
			// retry delay.
			rw = &rewind{tp: k, part: pt, offset: r.Offset, epoch: r.LeaderEpoch, delay: min(res.Delay, c.shared.RetryDelay)}
			continue
		}
		done = append(done, r)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if pt.revoked || c.crashed.Load() {
		return nil, false
	}
	// A delivery counts when the handler ran: a record that waited for a
	// key in progress elsewhere, or behind a failing record, is not closer
	// to the dead-letter topic for that.
	for i, r := range records {
		if ran[i].Load() {
			pt.deliveries[r.Offset]++
		}
	}
	if len(done) > 0 {
		c.cl.MarkCommitRecords(done[len(done)-1])
		for _, r := range done {
			delete(pt.deliveries, r.Offset)
		}
	}
	return rw, rw == nil
}

// deadLetter produces r to the dead-letter topic with the original headers
// and the error, and waits for the broker's acknowledgement.
func (c *Consumer) deadLetter(ctx context.Context, r *kgo.Record, cause error, deliveries int) error {
	msg := "unknown"
	if cause != nil {
		msg = cause.Error()
	}
	headers := make([]kgo.RecordHeader, 0, len(r.Headers)+5)
	headers = append(headers, r.Headers...)
	headers = append(headers,
		kgo.RecordHeader{Key: HeaderError, Value: []byte(msg)},
		kgo.RecordHeader{Key: HeaderTopic, Value: []byte(r.Topic)},
		kgo.RecordHeader{Key: HeaderPartition, Value: strconv.AppendInt(nil, int64(r.Partition), 10)},
		kgo.RecordHeader{Key: HeaderOffset, Value: strconv.AppendInt(nil, r.Offset, 10)},
		kgo.RecordHeader{Key: HeaderDeliveries, Value: strconv.AppendInt(nil, int64(deliveries), 10)},
	)
	d := &kgo.Record{Topic: c.dlq(r.Topic), Key: r.Key, Value: r.Value, Headers: headers}
	pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := c.cl.ProduceSync(pctx, d).FirstErr(); err != nil {
		return fmt.Errorf("kafka: dead-lettering %s/%d@%d: %w", r.Topic, r.Partition, r.Offset, err)
	}
	return nil
}

// errShutdownTimeout is the cause of the cancellation of the handlers'
// contexts when the shutdown timeout passed.
var errShutdownTimeout = errors.New("kafka: shutdown timeout passed")
