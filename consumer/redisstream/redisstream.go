package redisstream

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/redis/go-redis/v9"
)

// Defaults of the Consumer's options.
const (
	DefaultBatchSize       = 100
	DefaultBlock           = time.Second
	DefaultKeyField        = "key"
	DefaultMaxDeliveries   = 5
	DefaultRetryDelay      = time.Second
	DefaultShutdownTimeout = 10 * time.Second
)

// Handler processes one stream entry. ctx carries the idempotency lease
// (idem.FenceFrom, idem.LeaseFrom) and is cancelled, with cause
// idem.ErrLeaseLost, when the lease is lost. A nil error completes the key
// and acknowledges the entry; an error releases the key and leaves the entry
// pending (redelivered), or dead-letters it after the maximum of
// deliveries or when marked with idem.Terminal.
type Handler func(ctx context.Context, msg redis.XMessage) error

// KeyFunc returns the idempotency key of an entry; "" means none (the entry
// is dead-lettered with consumer.ErrNoKey).
type KeyFunc func(msg redis.XMessage) string

// KeyField returns a KeyFunc that reads the key from the entry's field name.
func KeyField(name string) KeyFunc {
	return func(msg redis.XMessage) string {
		v, _ := msg.Values[name].(string)
		return v
	}
}

// KeyHash returns a KeyFunc that hashes the named fields
// (consumer.HashKey of their values): for payloads that carry no key but
// whose listed fields identify them. A missing field hashes as empty; if
// all are missing there is no key.
func KeyHash(fields ...string) KeyFunc {
	return func(msg redis.XMessage) string {
		vals := make([]string, len(fields))
		found := false
		for i, f := range fields {
			v, ok := msg.Values[f].(string)
			found = found || ok
			vals[i] = v
		}
		if !found {
			return ""
		}
		return consumer.HashKey(vals...)
	}
}

// Option configures a Consumer: the options of package consumer shared by
// every adapter (consumer.WithScope, consumer.WithMaxDeliveries,
// consumer.WithRetryDelay, consumer.WithBatchSize,
// consumer.WithShutdownTimeout, consumer.WithDeadLetter,
// consumer.WithLogger, consumer.WithEventHook, consumer.WithOnLeaseLost,
// consumer.WithPassDuplicates) and this package's own.
//
// For Redis Streams: the default scope is the stream name; the batch size
// is how many entries one XREADGROUP (COUNT) or XAUTOCLAIM fetches and one
// pipelined round of acquisitions and completions handles, default
// DefaultBatchSize (100), in 1..10,000; the maximum of deliveries counts
// the group's delivery counter, default DefaultMaxDeliveries (5); a
// retried entry is left pending and claimed again once idle for the claim
// idle time, so the effective retry delay (default DefaultRetryDelay, 1s)
// is max(retry delay, claim idle); the shutdown timeout is
// DefaultShutdownTimeout (10s); the dead-letter destination is a stream,
// default "<stream>:dlq", which shares the stream's hash tag, and gets the
// entry's fields plus "dlq-error", "dlq-id" and "dlq-deliveries". Run
// processes one batch at a time while the previous one completes:
// consumer.WithConcurrency must be 1.
type Option = consumer.Option

type config struct {
	block      time.Duration
	keyFn      KeyFunc
	fpFn       func(redis.XMessage) string
	claimIdle  time.Duration
	groupStart string
}

// WithBlock sets how long XREADGROUP blocks waiting for new entries (BLOCK).
// It bounds how fast Run notices its context's cancellation. The default is
// DefaultBlock (1s); it must be at least 1ms.
func WithBlock(d time.Duration) Option {
	return consumer.AdapterOption(func(c *config) { c.block = d })
}

// WithKeyFunc sets how an entry's idempotency key is found. The default is
// KeyField(DefaultKeyField), the field "key".
func WithKeyFunc(f KeyFunc) Option { return consumer.AdapterOption(func(c *config) { c.keyFn = f }) }

// WithFingerprint sets a function returning an entry's payload fingerprint
// (at most storekit.MaxFingerprintLen bytes): a key reused with another
// fingerprint is dead-lettered with idem.ErrMismatch. The default is none.
func WithFingerprint(f func(msg redis.XMessage) string) Option {
	return consumer.AdapterOption(func(c *config) { c.fpFn = f })
}

// WithClaimIdle sets after how long without activity a pending entry is
// claimed (XAUTOCLAIM) from its consumer: a crashed consumer's entries, and
// entries left pending for a retry. While a handler runs, its batch's
// entries are touched (XCLAIM … JUSTID to the same consumer) every third of
// it, so a live consumer keeps them. The default is the executor's lease;
// it must be at least 3ms.
func WithClaimIdle(d time.Duration) Option {
	return consumer.AdapterOption(func(c *config) { c.claimIdle = d })
}

// WithGroupStart sets the ID from which a consumer group created by Run
// (XGROUP CREATE … MKSTREAM) starts: "0" for the whole stream, "$" for new
// entries only. An existing group is left as it is. The default is "0".
func WithGroupStart(id string) Option {
	return consumer.AdapterOption(func(c *config) { c.groupStart = id })
}

// Consumer reads a Redis stream in a consumer group and runs a Handler at
// most once per idempotency key (see the package documentation). Run it
// once; its methods are safe for concurrent use.
type Consumer struct {
	rdb    redis.UniversalClient
	store  *redisstore.Store
	exec   *idem.Executor
	stream string
	group  string
	name   string

	h Handler
	config
	batch    int
	dlq      string
	shutdown time.Duration

	proc    *consumer.Processor
	running atomic.Bool

	// crash, for tests, is called once the keys of a batch are acquired,
	// if it holds any; when it returns true the consumer stops at once as
	// a crashed process would: nothing more is run, completed, released or
	// acknowledged.
	crash func() bool
	// baseline, for the benchmark, replaces the processing of a batch up to
	// its tail, which it returns (run as a tail like process's), so that
	// the same loop runs without idempotency (bench_test.go); it counts
	// its acknowledged entries in baselineAcked.
	baseline      func(ctx context.Context, msgs []redis.XMessage, h Handler) (finish func())
	baselineAcked atomic.Int64
}

// New returns a Consumer of stream in group, as consumer name, that reads
// entries with rdb and runs h at most once per key on exec, through a
// consumer.Processor (the one consumer algorithm) that acquires each batch
// with one BeginBatch. exec's store must be a *redisstore.Store: the
// completion of a key and the XACK of its entry happen in one script on it
// (the Processor's commit hook, through adapterkit.CommitBatchWith, so
// the result is encoded, and sealed with WithEncryption, by the Executor),
// so stream, its dead-letter stream and the store's records must be able
// to share a script: on a Cluster, create the store with
// redisstore.WithHashTag(tag) and name the streams "{tag}…" (see
// redisstore.Store.CheckStream). New does no I/O. Errors wrap
// idem.ErrInvalid.
func New(rdb redis.UniversalClient, stream, group, name string, exec *idem.Executor, h Handler, opts ...Option) (*Consumer, error) {
	switch {
	case rdb == nil:
		return nil, fmt.Errorf("%w: redisstream: nil client", idem.ErrInvalid)
	case stream == "" || group == "" || name == "":
		return nil, fmt.Errorf("%w: redisstream: empty stream, group or consumer name", idem.ErrInvalid)
	case exec == nil:
		return nil, fmt.Errorf("%w: redisstream: nil executor", idem.ErrInvalid)
	case h == nil:
		return nil, fmt.Errorf("%w: redisstream: nil handler", idem.ErrInvalid)
	}
	store, ok := adapterkit.Store(exec).(*redisstore.Store)
	if !ok {
		return nil, fmt.Errorf("%w: redisstream: the executor's store is a %T, not a *redisstore.Store", idem.ErrInvalid, adapterkit.Store(exec))
	}
	c := &Consumer{
		rdb: rdb, store: store, exec: exec, stream: stream, group: group, name: name, h: h,
		config: config{block: DefaultBlock, keyFn: KeyField(DefaultKeyField), claimIdle: adapterkit.Lease(exec), groupStart: "0"},
	}
	proc, shared, err := consumer.Setup(exec, consumer.Config{
		Scope:           stream,
		MaxDeliveries:   DefaultMaxDeliveries,
		RetryDelay:      DefaultRetryDelay,
		BatchSize:       DefaultBatchSize,
		ShutdownTimeout: DefaultShutdownTimeout,
		DeadLetter:      stream + ":dlq",
		Commit:          c.completeAndAck,
	}, &c.config, opts)
	if err != nil {
		return nil, fmt.Errorf("redisstream: %w", err)
	}
	c.proc, c.batch, c.dlq, c.shutdown = proc, shared.BatchSize, shared.DeadLetter, shared.ShutdownTimeout
	switch {
	case c.batch > 10000:
		return nil, fmt.Errorf("%w: redisstream: batch size %d is not in 1..10000", idem.ErrInvalid, c.batch)
	case shared.Concurrency != 1:
		return nil, fmt.Errorf("%w: redisstream: concurrency %d: run several consumers instead", idem.ErrInvalid, shared.Concurrency)
	case c.block < time.Millisecond:
		return nil, fmt.Errorf("%w: redisstream: block %v is shorter than 1ms", idem.ErrInvalid, c.block)
	case c.keyFn == nil:
		return nil, fmt.Errorf("%w: redisstream: nil key function", idem.ErrInvalid)
	case c.claimIdle < 3*time.Millisecond:
		return nil, fmt.Errorf("%w: redisstream: claim idle %v is shorter than 3ms", idem.ErrInvalid, c.claimIdle)
	case c.dlq == "" || c.dlq == stream:
		return nil, fmt.Errorf("%w: redisstream: the dead-letter stream %q must be named and differ from the stream", idem.ErrInvalid, c.dlq)
	case c.groupStart == "":
		return nil, fmt.Errorf("%w: redisstream: empty group start ID", idem.ErrInvalid)
	}
	if err := store.CheckStream(stream, c.dlq); err != nil {
		return nil, fmt.Errorf("redisstream: %w", err)
	}
	return c, nil
}

// Executor returns the consumer's executor.
func (c *Consumer) Executor() *idem.Executor { return c.exec }

// Stats returns a snapshot of the counters (Errors counts failed reads,
// claims and acknowledgements, retried by the loop).
func (c *Consumer) Stats() consumer.Stats { return c.proc.Stats() }

// errCrashed ends Run after a simulated crash (tests).
var errCrashed = errors.New("redisstream: crashed")

// Run creates the consumer group if it does not exist, then reads and
// processes batches until ctx is cancelled: first entries idle for longer
// than the claim idle time (XAUTOCLAIM, from crashed consumers or left for
// a retry), then new ones (XREADGROUP … COUNT batch BLOCK block). Failed
// reads are retried after a short pause and counted in Stats.Errors.
//
// A batch is completed and acknowledged while the next one is read,
// acquired and handled (see process).
//
// When ctx is cancelled Run stops fetching, lets the batch in flight finish
// for up to the shutdown timeout, then cancels the handlers still running
// and releases their keys (their entries stay pending and are claimed by
// another consumer), waits for the last completion, and returns nil. A
// handler that ignores the cancellation is abandoned consumer.AbandonAfter
// later: its entry stays pending, its key is left to its lease, and its
// goroutine runs on after Run returned until it returns; what it returns
// then is ignored. So Run returns within about the shutdown timeout plus
// consumer.AbandonAfter. Run
// returns an error for a second concurrent Run, or when the group cannot
// be created.
func (c *Consumer) Run(ctx context.Context) error {
	h := c.h
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("redisstream: Run is already running")
	}
	defer c.running.Store(false)
	err := c.rdb.XGroupCreateMkStream(ctx, c.stream, c.group, c.groupStart).Err()
	if err != nil && !redis.HasErrorPrefix(err, "BUSYGROUP") {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("redisstream: creating group %q of %q: %w", c.group, c.stream, err)
	}
	// Handlers and store calls run on work, which outlives ctx by the
	// shutdown timeout.
	work, stopAfter := consumer.GraceContext(ctx, c.shutdown, errShutdownTimeout)
	defer stopAfter()

	// prev is the batch whose completion (tail) may still be running while
	// the next batch is read, acquired and handled.
	var prev *tail
	defer func() { prev.wait() }()
	claimStart := "0-0"
	nextClaim := time.Time{}
	for ctx.Err() == nil {
		var msgs []redis.XMessage
		claimed := false
		if now := time.Now(); !now.Before(nextClaim) {
			// The previous batch's tail must end first: until it has
			// acknowledged or dead-lettered its entries they are pending,
			// and one idle for longer than the claim idle time (a slow
			// tail) would be claimed back and dead-lettered, replayed or
			// retried a second time.
			prev.wait()
			res, start, err := c.rdb.XAutoClaim(ctx, &redis.XAutoClaimArgs{
				Stream: c.stream, Group: c.group, Consumer: c.name,
				MinIdle: c.claimIdle, Start: claimStart, Count: int64(c.batch),
			}).Result()
			if err != nil {
				if ctx.Err() != nil {
					break
				}
				c.pause(ctx, err)
				continue
			}
			msgs, claimed = res, true
			claimStart = start
			if start == "0-0" {
				// Whole pending list scanned: look again in a while.
				nextClaim = now.Add(c.claimIdle / 4)
			}
		}
		if len(msgs) == 0 {
			claimed = false
			streams, err := c.rdb.XReadGroup(ctx, &redis.XReadGroupArgs{
				Group: c.group, Consumer: c.name, Streams: []string{c.stream, ">"},
				Count: int64(c.batch), Block: c.block,
			}).Result()
			if err != nil {
				if errors.Is(err, redis.Nil) || ctx.Err() != nil {
					continue
				}
				c.pause(ctx, err)
				continue
			}
			for _, s := range streams {
				msgs = append(msgs, s.Messages...)
			}
		}
		if len(msgs) == 0 {
			continue
		}
		deliveries, err := c.deliveries(work, msgs, claimed)
		if err != nil {
			c.pause(ctx, err)
			continue
		}
		var crashed bool
		if prev, crashed = c.process(work, msgs, deliveries, h, prev); crashed {
			return errCrashed
		}
	}
	return nil
}

// pause counts a failed call and waits a little before the next.
func (c *Consumer) pause(ctx context.Context, err error) {
	c.proc.ReportError("reading the stream", err)
	t := time.NewTimer(50 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// deliveries returns the delivery count of each entry: 1 for entries read
// with ">", the group's counter (XPENDING) for claimed ones.
func (c *Consumer) deliveries(ctx context.Context, msgs []redis.XMessage, claimed bool) ([]int, error) {
	out := make([]int, len(msgs))
	if !claimed {
		for i := range out {
			out[i] = 1
		}
		return out, nil
	}
	// One XPENDING per entry, in one pipeline: a range query could be
	// crowded out by this consumer's other pending entries.
	cmds := make([]*redis.XPendingExtCmd, len(msgs))
	_, err := c.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, m := range msgs {
			cmds[i] = p.XPendingExt(ctx, &redis.XPendingExtArgs{
				Stream: c.stream, Group: c.group, Start: m.ID, End: m.ID, Count: 1,
			})
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("redisstream: XPENDING: %w", err)
	}
	for i, cmd := range cmds {
		out[i] = 1
		if p := cmd.Val(); len(p) == 1 {
			out[i] = max(int(p[0].RetryCount), 1)
		}
	}
	return out, nil
}

// tail is the end of a batch's processing (complete and acknowledge,
// dead-letter, count), which runs while the next batch is read, acquired
// and handled: Redis and the client work at the same time instead of in
// turn. At most one tail runs at a time, and none while pending entries
// are claimed (Run waits for it before XAUTOCLAIM).
type tail struct {
	done chan struct{}
	keys map[string]bool // the batch's idempotency keys
}

// wait returns when t, if any, has ended.
func (t *tail) wait() {
	if t != nil {
		<-t.done
	}
}

// process handles one batch with the Processor: acquire every key, run the
// handlers in order, then complete and acknowledge the successful ones in
// one pipelined round of complete-and-ack scripts (the Processor's commit
// hook, completeAndAck). That last part runs in a goroutine, returned as a
// tail, once prev, the previous batch's tail, has ended; and if the batch
// has a key of prev's batch, prev ends before anything is acquired, so
// that a duplicate in the next batch finds its key completed, as it would
// without the overlap. It reports whether a simulated crash happened (then
// prev has ended and no tail runs).
func (c *Consumer) process(ctx context.Context, msgs []redis.XMessage, deliveries []int, h Handler, prev *tail) (next *tail, crashed bool) {
	if c.baseline != nil {
		finish := c.baseline(ctx, msgs, h)
		prev.wait()
		next = &tail{done: make(chan struct{})}
		go func() {
			defer close(next.done)
			finish()
		}()
		return next, false
	}
	in := make([]consumer.Message, len(msgs))
	next = &tail{done: make(chan struct{}), keys: make(map[string]bool, len(msgs))}
	for i, m := range msgs {
		in[i] = consumer.Message{Key: c.keyFn(m), Deliveries: deliveries[i], ID: m.ID}
		if c.fpFn != nil {
			in[i].Fingerprint = c.fpFn(m)
		}
		if k := in[i].Key; k != "" {
			next.keys[k] = true
			if prev != nil && prev.keys[k] {
				prev.wait()
			}
		}
	}
	b := c.proc.Acquire(ctx, in)
	held := make([]string, 0, len(msgs))
	for i, m := range msgs {
		if b.Held(i) {
			held = append(held, m.ID)
		}
	}
	if c.crash != nil && len(held) > 0 && c.crash() {
		b.Abandon() // stop heartbeats; the records stay IN_PROGRESS
		prev.wait()
		return nil, true
	}
	// Keep the batch's entries from being claimed while handlers run.
	stopTouch := c.touch(ctx, held)
	b.Handle(func(ctx context.Context, i int) error { return h(ctx, msgs[i]) })
	stopTouch()
	prev.wait()
	go func() {
		defer close(next.done)
		c.settle(ctx, msgs, deliveries, b.Commit(ctx))
	}()
	return next, false
}

// settle carries out the Processor's decisions: the processed entries were
// acknowledged with their completion; replays get one XACK for all; dead
// letters are moved to the dead-letter stream; retries stay pending.
func (c *Consumer) settle(ctx context.Context, msgs []redis.XMessage, deliveries []int, results []consumer.Result) {
	sctx := context.WithoutCancel(ctx)
	var replayIDs []string
	for i, r := range results {
		switch {
		case r.Action == consumer.Ack && r.Replayed:
			replayIDs = append(replayIDs, msgs[i].ID)
		case r.Action == consumer.DeadLetter:
			c.deadLetter(sctx, msgs[i], deliveries[i], r.Err)
		}
	}
	if len(replayIDs) > 0 {
		if err := c.rdb.XAck(sctx, c.stream, c.group, replayIDs...).Err(); err != nil {
			c.proc.ReportError("acknowledging replays", err) // left pending: claimed and replayed again
		}
	}
}

// completeAndAck is the Processor's commit hook: the Executor encodes each
// result and the store completes each key and acknowledges its entry in
// one script, repeated (as adapterkit.CommitBatch does) while the outcome is
// unknown: an entry left pending with its key IN_PROGRESS would be claimed
// after the lease and run again.
func (c *Consumer) completeAndAck(ctx context.Context, msgs []consumer.Message, attempts []*idem.Attempt, values [][]byte) []error {
	return adapterkit.CommitBatchWith(ctx, c.exec, attempts, values, func(ctx context.Context, cs []storekit.BatchCompletion) []error {
		acks := make([]redisstore.StreamAck, len(cs))
		for k, x := range cs {
			// A handler's effect (idem.SetEffect) is applied in the same
			// call as the completion and the XACK.
			acks[k] = redisstore.StreamAck{Key: x.Key, Lease: x.Lease, Result: x.Result, ID: msgs[x.Index].ID, Effect: x.Effect}
		}
		return c.store.CompleteAndAckBatch(ctx, c.stream, c.group, cs[0].Retention, acks)
	})
}

// deadLetter copies m to the dead-letter stream and acknowledges it in one
// script; if that fails the entry stays pending and is dead-lettered again
// when claimed (its key is FAILED by then, or it has no key).
func (c *Consumer) deadLetter(ctx context.Context, m redis.XMessage, deliveries int, cause error) {
	fields := make([]string, 0, 2*len(m.Values)+6)
	for k, v := range m.Values {
		fields = append(fields, k, fmt.Sprint(v))
	}
	msg := "unknown"
	if cause != nil {
		msg = cause.Error()
	}
	fields = append(fields, "dlq-error", msg, "dlq-id", m.ID, "dlq-deliveries", strconv.Itoa(deliveries))
	if _, err := c.store.DeadLetter(ctx, c.stream, c.group, m.ID, c.dlq, fields); err != nil {
		c.proc.ReportError("dead-lettering", err) // left pending: dead-lettered again when claimed
	}
	// Not pending any more (false): another consumer dealt with it.
}

// touch resets the idle time of the entries ids (the batch's acquired
// ones) every third of the claim idle time (XCLAIM … JUSTID to this
// consumer, which does not count a delivery), so that other consumers do
// not claim entries whose handler is still running: the broker-side
// counterpart of the lease heartbeat. It returns a function that stops it.
func (c *Consumer) touch(ctx context.Context, ids []string) func() {
	if len(ids) == 0 {
		return func() {}
	}
	return consumer.KeepAlive(c.claimIdle/3, func() {
		if ctx.Err() != nil {
			return
		}
		err := c.rdb.XClaimJustID(ctx, &redis.XClaimArgs{
			Stream: c.stream, Group: c.group, Consumer: c.name, MinIdle: 0, Messages: ids,
		}).Err()
		if err != nil {
			c.proc.ReportError("keeping entries claimed", err)
		}
	})
}

// errShutdownTimeout is the cause of the cancellation of the handlers'
// contexts when the shutdown timeout passed.
var errShutdownTimeout = errors.New("redisstream: shutdown timeout passed")
