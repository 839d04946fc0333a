package idem

import (
	"context"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/internal/execseam"
	"github.com/idemgo/idem/observe"
	"github.com/idemgo/idem/storekit"
)

// defaultCompressAbove is the default of WithCompressAbove; no other
// package needs it.
const defaultCompressAbove = 4 << 10

// FailurePolicy decides whether an error returned by the operation is
// terminal (the key becomes FAILED and the error text is replayed to later
// callers) or retryable (the key is released and the next call runs the
// operation again).
type FailurePolicy func(err error) (terminal bool)

// Option configures an Executor.
type Option func(*Executor)

// WithLease sets how long an attempt holds a key before another caller may
// take it over. While the operation runs, the Executor extends the lease
// every third of it. The default is 30s (adapterkit.DefaultLease); it must be at least
// 1ms.
func WithLease(d time.Duration) Option { return func(e *Executor) { e.lease = d } }

// WithRetention sets how long a COMPLETED or FAILED record is kept and
// replayed. The default is 24h (adapterkit.DefaultRetention); it must be at least the
// lease.
func WithRetention(d time.Duration) Option { return func(e *Executor) { e.retention = d } }

// WithMaxAttempts sets the number of acquisitions after which a key that
// keeps failing (retryable errors, panics, expired leases) becomes FAILED.
// The default is 0: no limit.
func WithMaxAttempts(n int) Option { return func(e *Executor) { e.maxAttempts = n } }

// WithFailurePolicy sets how errors returned by the operation are classified.
// The default is IsTerminal: errors marked with Terminal are terminal, all
// others retryable.
func WithFailurePolicy(p FailurePolicy) Option { return func(e *Executor) { e.policy = p } }

// WithMaxResultSize sets the largest result, in bytes before compression,
// that is stored. A larger result is still returned to the caller of Do, but
// the key becomes FAILED (the operation ran; running it again could repeat
// its effect) and Do returns an error wrapping ErrResultTooLarge. The
// default is 1 MiB (adapterkit.DefaultMaxResultSize).
func WithMaxResultSize(n int) Option { return func(e *Executor) { e.codec.maxSize = n } }

// WithCompressAbove sets the size above which stored results are deflated
// (when that makes them smaller). A negative value disables compression.
// The default is 4 KiB.
func WithCompressAbove(n int) Option { return func(e *Executor) { e.codec.compressAbove = n } }

// WithEncryption seals stored results with aead (for example AES-GCM), with
// the store key as associated data, so that a result cannot be read from the
// store or moved to another key. With a key set, a stored result that is
// not sealed is refused (ErrCorruptResult), never replayed: whoever can
// write to the store cannot plant one. The default is no encryption.
func WithEncryption(aead cipher.AEAD) Option { return func(e *Executor) { e.codec.aead = aead } }

// WithWait makes Do and Begin wait, up to d, for a key that another caller
// holds (IN_PROGRESS) to be released or to end, instead of returning an
// *InProgressError at once; then they replay the stored result, return the
// stored failure, or take the key and run. The wait is woken by the
// store's notification when the store implements storekit.Watcher (memstore,
// boltstore, redisstore and pgstore do), and polls otherwise (see Await);
// it never lasts past the holder's lease. A call still waiting after d
// returns an *InProgressError whose RetryAfter is the lease left. A call
// can set its own bound with WaitFor. The default is 0: no waiting.
// adapterkit.BeginBatch never waits.
func WithWait(d time.Duration) Option { return func(e *Executor) { e.wait = d } }

// CallOption configures one call of Do, Begin or Typed.Do.
type CallOption func(*callConfig)

// callConfig is what CallOptions set.
type callConfig struct {
	wait time.Duration
}

// WaitFor makes this call wait up to d for a key in progress, as WithWait
// does for every call; it overrides the Executor's WithWait (WaitFor(0):
// no waiting).
func WaitFor(d time.Duration) CallOption { return func(c *callConfig) { c.wait = d } }

// Executor runs operations at most once per key on top of a Store. It is safe
// for concurrent use; create one per store and configuration and share it.
type Executor struct {
	store       Store
	lease       time.Duration
	retention   time.Duration
	maxAttempts int
	wait        time.Duration
	policy      FailurePolicy
	codec       blobCodec
	onLeaseLost func(context.Context, LeaseLost)
	observer    observe.Observer

	ownerPrefix string
	ownerSeq    atomic.Uint64
}

// New returns an Executor on store. It returns an error wrapping ErrInvalid
// for a nil store or an invalid option.
func New(store Store, opts ...Option) (*Executor, error) {
	if store == nil {
		return nil, invalidf("nil store")
	}
	e := &Executor{
		store:     store,
		lease:     execseam.DefaultLease,
		retention: execseam.DefaultRetention,
		policy:    IsTerminal,
		codec:     blobCodec{compressAbove: defaultCompressAbove, maxSize: execseam.DefaultMaxResultSize},
	}
	for _, o := range opts {
		o(e)
	}
	switch {
	case e.lease < time.Millisecond:
		return nil, invalidf("lease %v is shorter than 1ms", e.lease)
	case e.retention < e.lease:
		return nil, invalidf("retention %v is shorter than the lease %v", e.retention, e.lease)
	case e.wait < 0:
		return nil, invalidf("wait %v is negative", e.wait)
	case e.maxAttempts < 0:
		return nil, invalidf("max attempts %d is negative", e.maxAttempts)
	case e.policy == nil:
		return nil, invalidf("nil failure policy")
	case e.codec.maxSize <= 0:
		return nil, invalidf("max result size %d is not positive", e.codec.maxSize)
	}
	var b [9]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("idem: reading random owner prefix: %w", err)
	}
	e.ownerPrefix = base64.RawURLEncoding.EncodeToString(b[:]) + "."
	return e, nil
}

// decodeResult returns the value held by blob, a stored result as
// Store.Get returns it in Record.Result for the store key storeKey
// (adapterkit.DecodeResult).
func (e *Executor) decodeResult(storeKey string, blob []byte) ([]byte, error) {
	return e.codec.decode(storeKey, blob)
}

// keyAndOwner returns key's store key and a new owner token. Both live in
// one string, to save an allocation on the hot path.
func (e *Executor) keyAndOwner(key Key) (skey, owner string) {
	var buf [96]byte
	b := key.appendDigest(buf[:0])
	b = append(b, e.ownerPrefix...)
	b = strconv.AppendUint(b, e.ownerSeq.Add(1), 36)
	s := string(b)
	return s[:storekit.DigestLen], s[storekit.DigestLen:]
}

// beater holds an attempt's reusable timers: the heartbeat, and the
// expiry at the lease's local deadline. Arming pooled timers instead of
// calling time.AfterFunc per attempt saves allocations per call.
type beater struct {
	t *time.Timer // heartbeat
	x *time.Timer // expiry
	a atomic.Pointer[Attempt]
}

var beaters = sync.Pool{New: func() any {
	b := &beater{}
	b.t = time.AfterFunc(time.Hour, b.fire)
	b.t.Stop()
	b.x = time.AfterFunc(time.Hour, b.expire)
	b.x.Stop()
	return b
}}

func (b *beater) fire() {
	if a := b.a.Load(); a != nil {
		a.heartbeat()
	}
}

// expire runs at the lease's local deadline: unless an extension moved it
// meanwhile, it cancels the attempt's context, before the store's lease
// ends. It takes no lock, so that a slow extension cannot delay it.
func (b *beater) expire() {
	a := b.a.Load()
	if a == nil {
		return
	}
	if left := a.deadline.left(); left > 0 {
		b.x.Reset(left)
		return
	}
	a.cancel(fmt.Errorf("%w: the lease of fence %d ended by the local clock before an extension succeeded", ErrLeaseLost, a.lease.Fence))
}

// epoch is the origin of localDeadline's monotonic readings.
var epoch = time.Now()

// localDeadline is the local time at which a lease ends at the latest: the
// time the call that set it (the acquire, or the last successful
// extension) was sent, plus the lease. The store computes the lease's end
// from its own clock when the call arrives, so it ends later than this, by
// the call's one-way delay, clocks running at the same rate. It is read
// without a lock.
type localDeadline struct{ ns atomic.Int64 } // since epoch, monotonic

func (d *localDeadline) set(t time.Time)     { d.ns.Store(int64(t.Sub(epoch))) }
func (d *localDeadline) time() time.Time     { return epoch.Add(time.Duration(d.ns.Load())) }
func (d *localDeadline) left() time.Duration { return time.Until(d.time()) }

// withoutCancel returns a context for store calls that must happen even if
// ctx was cancelled (completing, releasing).
func withoutCancel(ctx context.Context) context.Context {
	if ctx.Done() == nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

// Result is what Do returns.
type Result struct {
	// Value is the operation's result: the one fn returned, or the stored
	// one for a replay. A replayed Value may share memory with the store and
	// must not be modified.
	Value []byte
	// Replayed is true when fn did not run because the key was already
	// COMPLETED.
	Replayed bool
	// Fence is the fencing token of this call's execution (zero for a
	// replay).
	Fence int64
}

// Do runs fn at most once per key while the store holds the key's record.
//
//   - If the key is new, released, or its previous owner's lease expired, Do
//     runs fn with a context that carries the lease (see LeaseFrom and
//     FenceFrom) and is cancelled, with a cause wrapping ErrLeaseLost, if the
//     lease is lost or its local deadline passes without a successful
//     extension (see Attempt.LeaseDeadline). fn's result is stored and returned.
//     While fn runs, the lease is extended every third of it. fn never
//     starts after the lease's local deadline: an acquire whose reply comes
//     later releases the key and Do returns an error wrapping ErrLeaseLost.
//   - If the key is COMPLETED with the same fingerprint, Do returns the
//     stored result with Replayed set and does not run fn.
//   - If another caller holds the key, Do returns an *InProgressError, or
//     with WithWait or WaitFor first waits for that caller's attempt to end
//     and then replays, fails or runs as above.
//   - If the key exists with another fingerprint, ErrMismatch.
//   - If the key is FAILED, a *FailedError.
//
// If fn returns an error, Do returns it and, per the failure policy, either
// releases the key (retryable) or stores the failure (terminal). If fn
// panics, the key is released and the panic continues. If the lease was lost
// while fn ran, Do returns an error wrapping ErrLeaseLost and nothing is
// stored (see WithOnLeaseLost to compensate). Store errors are returned
// wrapped.
//
// Once fn has run, the store call that ends the attempt (complete, fail or
// release) is repeated with the same lease while it fails with an error
// that leaves its outcome unknown (see storekit.OutcomeUnknown), for up to one lease:
// giving up at once would leave the key IN_PROGRESS, to be taken over and
// run again after the lease. So while the store is unreachable, such a Do
// returns after up to one lease. The same holds for Commit, Fail, Release
// and adapterkit.CommitBatch.
func (e *Executor) Do(ctx context.Context, key Key, fingerprint string, fn func(ctx context.Context) ([]byte, error), opts ...CallOption) (Result, error) {
	if fn == nil {
		return Result{}, invalidf("nil function")
	}
	actx, a, err := e.Begin(ctx, key, fingerprint, opts...)
	if err != nil {
		return Result{}, err
	}
	if a.replayed {
		return Result{Value: a.value, Replayed: true}, nil
	}
	ended := false
	defer func() {
		if !ended { // fn panicked or called runtime.Goexit
			_ = a.Release(withoutCancel(ctx))
		}
	}()
	v, ferr := fn(actx)
	ended = true
	sctx := withoutCancel(ctx)
	res := Result{Value: v, Fence: a.lease.Fence}
	if ferr != nil {
		err = ferr
		if serr := a.Fail(sctx, ferr); serr != nil {
			err = errors.Join(ferr, serr)
		}
	} else {
		err = a.Commit(sctx, v)
	}
	if e.onLeaseLost != nil && errors.Is(err, ErrLeaseLost) {
		e.onLeaseLost(sctx, LeaseLost{Key: key, Fence: a.lease.Fence, Err: ferr})
	}
	return res, err
}

// Attempt is one acquisition of a key, returned by Begin, for callers that
// cannot wrap their operation in a function. Exactly one of its endings,
// Commit, Fail, Release or Abandon, must be called (a replayed Attempt
// needs none). Its methods are safe for concurrent use; after the first
// ending, the others return ErrLeaseLost.
type Attempt struct {
	e        *Executor
	key      string // store key (digest)
	fp       string // the fingerprint it was acquired with
	lease    Lease
	previous string
	attempts int
	replayed bool
	value    []byte

	obs *attemptObs // with an Observer only

	cancel   context.CancelCauseFunc
	beat     *beater
	lctx     leaseCtx
	deadline localDeadline

	mu       sync.Mutex
	finished bool
	lost     bool
	effect   *Effect // SetEffect; read once finished
	lastTry  bool    // SetLastTry
}

// Begin acquires key for the caller. It returns the same errors as Do. On
// success the returned context carries the lease (LeaseFrom, FenceFrom,
// AttemptFrom) and is cancelled with a cause wrapping ErrLeaseLost when
// the lease is lost or its local deadline passes without a successful
// extension; the lease is extended every third of it until the attempt
// ends.
//
// If the key was already COMPLETED, Begin returns an Attempt whose Replayed
// method reports true and whose Value holds the stored result; nothing is to
// be done with it.
//
// If another caller holds the key, Begin waits as WithWait and WaitFor say
// (by default it does not wait). An error of the store while waiting is
// returned wrapped.
func (e *Executor) Begin(ctx context.Context, key Key, fingerprint string, opts ...CallOption) (context.Context, *Attempt, error) {
	wait := e.wait
	if len(opts) > 0 {
		c := callConfig{wait: wait}
		for _, o := range opts {
			o(&c)
		}
		if c.wait < 0 {
			return ctx, nil, invalidf("wait %v is negative", c.wait)
		}
		wait = c.wait
	}
	if wait <= 0 {
		return e.begin(ctx, key, fingerprint)
	}
	start := time.Now()
	c, a, err := e.begin(ctx, key, fingerprint)
	if err == nil || !errors.Is(err, ErrInProgress) {
		return c, a, err
	}
	return e.awaitBegin(ctx, key, fingerprint, start.Add(wait), err)
}

// awaitBegin waits, until deadline, for the key that err (an
// *InProgressError from begin) reports held to leave IN_PROGRESS, and
// calls begin again, as often as needed (a third caller may take the key
// first). It returns the last begin's results, or an *InProgressError with
// the lease left once the deadline passed. This is the one waiting loop:
// the HTTP middleware and the proxy wait through it.
func (e *Executor) awaitBegin(ctx context.Context, key Key, fp string, deadline time.Time, err error) (context.Context, *Attempt, error) {
	wctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	for {
		ip, ok := errors.AsType[*InProgressError](err)
		if !ok {
			return ctx, nil, err
		}
		asked := time.Now()
		if werr := e.Await(wctx, key); werr != nil {
			if wctx.Err() == nil {
				// The store failed while waiting.
				return ctx, nil, fmt.Errorf("idem: waiting for the key in progress: %w", werr)
			}
			if cerr := ctx.Err(); cerr != nil {
				return ctx, nil, cerr
			}
			return ctx, nil, &InProgressError{RetryAfter: max(ip.RetryAfter-time.Since(asked), 0)}
		}
		c, a, err2 := e.begin(ctx, key, fp)
		if err2 == nil || !errors.Is(err2, ErrInProgress) {
			return c, a, err2
		}
		err = err2
	}
}

// begin is Begin without waiting.
func (e *Executor) begin(ctx context.Context, key Key, fingerprint string) (context.Context, *Attempt, error) {
	if err := key.Validate(); err != nil {
		return ctx, nil, err
	}
	if len(fingerprint) > storekit.MaxFingerprintLen {
		return ctx, nil, invalidf("fingerprint is %d bytes, over the limit of %d", len(fingerprint), storekit.MaxFingerprintLen)
	}
	skey, owner := e.keyAndOwner(key)
	req := storekit.AcquireRequest{
		Fingerprint: fingerprint,
		Owner:       owner,
		Lease:       e.lease,
		Retention:   e.retention,
		MaxAttempts: e.maxAttempts,
	}
	// The first send: a repetition returns the acquisition that call made.
	sent := time.Now()
	acq, err := e.store.Acquire(ctx, skey, req)
	var store time.Duration
	// An acquire whose outcome is unknown may have taken the key: repeated
	// with the same owner it returns that acquisition, instead of leaving
	// the key held by nobody until the lease ends. A few quick repetitions
	// cover a dropped reply without delaying the error of a store that is
	// down by more than about 70ms.
	for r := acquireRepeats(); storekit.OutcomeUnknown(err) && r.wait(ctx); {
		acq, err = e.store.Acquire(ctx, skey, req)
	}
	if e.observer != nil {
		store = time.Since(sent)
	}
	if err != nil {
		err = fmt.Errorf("idem: acquire: %w", err)
		if e.observer != nil {
			e.observeBegin(ctx, key.scopeKind(), sent, store, err)
		}
		return ctx, nil, err
	}
	return e.begun(ctx, skey, key, fingerprint, acq, sent, store)
}

// begun turns an acquisition of key (store key skey) with fingerprint fp,
// whose acquire was sent at sent and took store, into Begin's results, and
// tells the Observer when no attempt starts.
func (e *Executor) begun(ctx context.Context, skey string, key Key, fp string, acq storekit.Acquisition, sent time.Time, store time.Duration) (context.Context, *Attempt, error) {
	c, a, err := e.acquired(ctx, skey, fp, acq, sent)
	if e.observer != nil {
		if a != nil && !a.replayed {
			a.obs = &attemptObs{kind: key.scopeKind(), started: sent, storeTime: store}
		} else {
			e.observeBegin(ctx, key.scopeKind(), sent, store, err)
		}
	}
	return c, a, err
}

// acquired is begun without the Observer.
func (e *Executor) acquired(ctx context.Context, skey, fp string, acq storekit.Acquisition, sent time.Time) (context.Context, *Attempt, error) {
	switch acq.Outcome {
	case storekit.Acquired, storekit.TakenOver:
	case storekit.Replay:
		if acq.State == storekit.StateFailed && len(acq.Result) == 0 {
			return ctx, nil, &FailedError{Replayed: true} // attempts exhausted
		}
		v, err := e.codec.decode(skey, acq.Result)
		if err != nil {
			return ctx, nil, err
		}
		if acq.State == storekit.StateFailed {
			return ctx, nil, &FailedError{Message: string(v), Replayed: true}
		}
		return ctx, &Attempt{e: e, key: skey, replayed: true, value: v, finished: true}, nil
	case storekit.InProgress:
		return ctx, nil, &InProgressError{RetryAfter: acq.RetryAfter}
	case storekit.Mismatch:
		return ctx, nil, ErrMismatch
	default:
		return ctx, nil, fmt.Errorf("idem: store returned unknown outcome %d", acq.Outcome)
	}
	a := &Attempt{
		e:        e,
		key:      skey,
		fp:       fp,
		lease:    acq.Lease,
		previous: acq.PreviousOwner,
		attempts: acq.Attempts,
	}
	deadline := sent.Add(e.lease)
	if left := time.Until(deadline); left <= 0 {
		// The reply came after the lease had ended by the local clock:
		// another caller may hold the key by now. The operation must not
		// start; the key is given back (a takeover makes that fail, which
		// changes nothing).
		_ = a.finish(withoutCancel(ctx), endRelease, nil, false)
		return ctx, nil, fmt.Errorf("%w: the acquire's reply came %v after it was sent, after the lease of %v had ended; nothing ran and the key was released",
			ErrLeaseLost, time.Since(sent).Round(time.Millisecond), e.lease)
	}
	a.deadline.set(deadline)
	cctx, cancel := context.WithCancelCause(ctx)
	a.cancel = cancel
	a.lctx = leaseCtx{Context: cctx, lease: acq.Lease, a: a}
	a.beat = beaters.Get().(*beater)
	a.beat.a.Store(a)
	// The first extension a third of the lease after the acquire was sent,
	// so that a slow reply leaves it as much time as a fast one.
	a.beat.t.Reset(max(time.Until(sent.Add(e.lease/3)), 0))
	a.beat.x.Reset(time.Until(deadline))
	return &a.lctx, a, nil
}

// Replayed reports whether the key was already COMPLETED: Value holds the
// stored result and nothing ran.
func (a *Attempt) Replayed() bool { return a.replayed }

// Value returns the stored result of a replayed Attempt. It may share memory
// with the store and must not be modified.
func (a *Attempt) Value() []byte { return a.value }

// Lease returns the attempt's lease (zero for a replay).
func (a *Attempt) Lease() Lease { return a.lease }

// TakenOver reports whether the key was taken over from a previous owner
// whose lease had expired, and that owner's token.
func (a *Attempt) TakenOver() (previousOwner string, ok bool) {
	return a.previous, a.previous != ""
}

// Attempts returns the number of acquisitions of the key so far, this one
// included.
func (a *Attempt) Attempts() int { return a.attempts }

// Key returns the store key (the digest of the idempotency key).
func (a *Attempt) Key() string { return a.key }

// Fingerprint returns the fingerprint the key was acquired with (empty for
// a replay).
func (a *Attempt) Fingerprint() string { return a.fp }

// Executor returns the Executor that made the attempt.
func (a *Attempt) Executor() *Executor { return a.e }

// LeaseDeadline returns the local time at which the attempt's lease ends at
// the latest: when the acquire (or the last successful extension) was sent,
// plus the lease. The attempt's context is cancelled then, unless an
// extension moved it; after the attempt ended it no longer moves. It is the
// zero time for a replay.
func (a *Attempt) LeaseDeadline() time.Time {
	if a.replayed {
		return time.Time{}
	}
	return a.deadline.time()
}

// heartbeat runs on the lease timer: it extends the lease, or cancels the
// attempt's context when the lease was lost.
func (a *Attempt) heartbeat() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.finished {
		return
	}
	interval := a.e.lease / 3
	sent := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), interval)
	err := a.e.store.Extend(ctx, a.key, a.lease, a.e.lease)
	cancel()
	if errors.Is(err, ErrLeaseLost) {
		a.lost = true
		a.cancel(fmt.Errorf("%w: extending the lease of fence %d", ErrLeaseLost, a.lease.Fence))
		return
	}
	if err == nil {
		a.deadline.set(sent.Add(a.e.lease))
	}
	// On other errors (store unreachable) try again at the next tick: the
	// lease is only lost once somebody else takes the key over, which the
	// store reports; until then the local deadline cancels the context.
	a.beat.t.Reset(max(time.Until(sent.Add(interval)), 0))
}

// end marks the attempt finished; it reports false if it already was, or if
// the lease was lost.
func (a *Attempt) end() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.finished {
		if a.replayed {
			return nil
		}
		return errAttemptEnded
	}
	a.finished = true
	if stopped := a.beat.t.Stop(); a.beat.x.Stop() && stopped {
		// Neither firing: the timers can serve another attempt. Otherwise
		// a firing heartbeat sees finished and returns, a firing expiry
		// cancels a context that is done with; the timers are dropped.
		a.beat.a.Store(nil)
		beaters.Put(a.beat)
	}
	a.beat = nil
	if a.lost {
		a.cancel(nil)
		return fmt.Errorf("%w: lost while the operation ran (fence %d)", ErrLeaseLost, a.lease.Fence)
	}
	return nil
}

// Commit stores value as the key's result and moves the record to
// COMPLETED. Commit does not keep value: the caller may reuse its memory
// once Commit returns. It returns an error wrapping ErrLeaseLost if the
// attempt is no longer the owner, and ErrResultTooLarge (after failing the key, since the
// operation ran) when value is over the size limit. Pass a context that
// outlives the request (see context.WithoutCancel): a commit that does not
// reach the store leaves the key IN_PROGRESS until its lease expires.
func (a *Attempt) Commit(ctx context.Context, value []byte) error {
	if a.replayed {
		return nil
	}
	if err := a.end(); err != nil {
		a.endFailed(ctx, err)
		return err
	}
	defer a.cancel(nil)
	if len(value) > a.e.codec.maxSize {
		tooLarge := resultTooLarge(len(value), a.e.codec.maxSize)
		if _, ferr := a.fail(ctx, tooLarge, true); ferr != nil {
			err := errors.Join(tooLarge, ferr)
			a.observeEnd(ctx, observe.Executed, ferr, err)
			return err
		}
		err := fmt.Errorf("%w; the key is FAILED", tooLarge)
		a.observeEnd(ctx, observe.Executed, nil, err)
		return err
	}
	blob, err := a.e.codec.encode(a.key, value)
	if err == nil && a.effect != nil {
		err = a.setPartialResult()
	}
	if err != nil {
		a.observeEnd(ctx, observe.NotRecorded, nil, err)
		return err
	}
	if err := a.finish(ctx, endComplete, blob, false); err != nil {
		if errors.Is(err, ErrEffect) {
			return a.effectFailed(ctx, err)
		}
		err = fmt.Errorf("idem: complete: %w", err)
		a.observeEnd(ctx, observe.Executed, err, err)
		return err
	}
	a.observeEnd(ctx, observe.Executed, nil, nil)
	return nil
}

// Fail ends the attempt after the operation failed with cause. The
// failure policy (WithFailurePolicy) decides what the record becomes:
// FAILED with cause's text stored, replayed to later calls as a
// *FailedError (terminal), or RELEASED, so that the next call runs the
// operation again (retryable; after the configured maximum of attempts a
// retryable failure is stored as FAILED too). On the attempt's last try
// (SetLastTry) the record becomes FAILED whatever the policy: mark it so
// when the operation took effect but its result cannot be stored (for
// example a response over the size limit). Fail returns the store's error,
// nil once the failure is recorded, and ErrLeaseLost when the attempt is
// no longer the owner.
func (a *Attempt) Fail(ctx context.Context, cause error) error {
	if a.replayed {
		return nil
	}
	if err := a.end(); err != nil {
		a.endFailed(ctx, err)
		return err
	}
	defer a.cancel(nil)
	a.mu.Lock()
	last := a.lastTry
	a.mu.Unlock()
	st, ferr := a.fail(ctx, cause, last || (cause != nil && a.e.policy(cause)))
	if ferr != nil {
		a.observeEnd(ctx, observe.Executed, ferr, errors.Join(cause, ferr))
		return ferr
	}
	a.observeEnd(ctx, failedOrReleased(st), nil, cause)
	return nil
}

// failedOrReleased returns the outcome of an attempt whose failure moved
// the record to st.
func failedOrReleased(st storekit.State) observe.Outcome {
	if st == storekit.StateFailed {
		return observe.Executed
	}
	return observe.Released
}

// fail stores a failure and returns the state the record moved to; the
// attempt has ended.
func (a *Attempt) fail(ctx context.Context, cause error, terminal bool) (storekit.State, error) {
	msg := ""
	if cause != nil {
		msg = cause.Error()
	}
	blob, err := a.e.codec.encode(a.key, []byte(msg))
	if err != nil {
		return 0, err
	}
	st, err := a.finishFail(ctx, blob, terminal)
	if err != nil {
		return 0, fmt.Errorf("idem: fail: %w", err)
	}
	return st, nil
}

// Abandon ends the attempt without a store call: the heartbeat stops and
// the record stays IN_PROGRESS until its lease expires, after which the
// next caller takes the key over, unless a writer of its own records the
// outcome first. o is the outcome the Observer (WithObserver) is told:
//
//   - observe.Abandoned when the operation's outcome is unknown (for
//     example an upstream timed out after receiving the request):
//     releasing could run it twice at once, storing could replay a result
//     that never was;
//   - the outcome recorded by other means, for a caller that records it
//     itself: a commit gate (postgres/pggate) commits the completion in
//     its own transaction and relays it to the store (observe.Executed),
//     or found a completion committed by an earlier run
//     (observe.Replayed).
//
// Abandon cannot fail, except with ErrLeaseLost when the attempt already
// ended or lost its lease (the Observer is then told of the lost lease).
func (a *Attempt) Abandon(ctx context.Context, o observe.Outcome) error {
	if a.replayed {
		return nil
	}
	if err := a.end(); err != nil {
		a.endFailed(ctx, err)
		return err
	}
	a.cancel(nil)
	a.observeEnd(ctx, o, nil, nil)
	return nil
}

// Release gives the key back without storing anything and without counting
// a failure: the next caller acquires it at once. Use it when the operation
// did not take effect (for example the request was rejected before it
// started).
func (a *Attempt) Release(ctx context.Context) error {
	if a.replayed {
		return nil
	}
	if err := a.end(); err != nil {
		a.endFailed(ctx, err)
		return err
	}
	defer a.cancel(nil)
	if err := a.finish(ctx, endRelease, nil, false); err != nil {
		err = fmt.Errorf("idem: release: %w", err)
		a.observeEnd(ctx, observe.Released, err, err)
		return err
	}
	a.observeEnd(ctx, observe.Released, nil, nil)
	return nil
}

// ending is the store call that ends an attempt.
type ending uint8

const (
	endComplete ending = iota
	endFail
	endRelease
)

// finish makes the store call that ends the attempt (complete with blob,
// fail with blob and terminal, or release), and repeats it with the same
// arguments while it fails with an error that leaves its outcome unknown (a
// timeout, a broken connection), as the Store contract allows: a repeated
// call never does anything twice. Giving up at once would leave the key
// IN_PROGRESS, and once the lease ended another caller would take it over
// and run the operation again. It stops at the first definite answer, when
// ctx is done, or after one lease.
func (a *Attempt) finish(ctx context.Context, op ending, blob []byte, terminal bool) error {
	_, err := a.finishState(ctx, op, blob, terminal)
	return err
}

// finishFail is finish for endFail; it returns the state the record moved
// to.
func (a *Attempt) finishFail(ctx context.Context, blob []byte, terminal bool) (storekit.State, error) {
	return a.finishState(ctx, endFail, blob, terminal)
}

// finishState is finish, returning the state Store.Fail answered (for
// endFail). With an Observer, the time of the calls is added to the
// attempt's store time.
func (a *Attempt) finishState(ctx context.Context, op ending, blob []byte, terminal bool) (storekit.State, error) {
	if a.obs != nil {
		defer func(start time.Time) { a.obs.storeTime += time.Since(start) }(time.Now())
	}
	var r repeater // set at the first unknown outcome
	var st storekit.State
	for {
		var err error
		switch op {
		case endComplete:
			if a.effect != nil {
				// SetEffect checked that the store is a storekit.EffectStore,
				// or unwraps to one. The completion goes to that store:
				// only it applies the effect atomically with the write.
				es, _ := storekit.StoreAs[storekit.EffectStore](a.e.store)
				err = es.CompleteEffect(ctx, a.key, a.lease, blob, a.e.retention, *a.effect)
			} else {
				err = a.e.store.Complete(ctx, a.key, a.lease, blob, a.e.retention)
			}
		case endFail:
			st, err = a.e.store.Fail(ctx, a.key, a.lease, storekit.Failure{
				Result:      blob,
				Terminal:    terminal,
				Retention:   a.e.retention,
				MaxAttempts: a.e.maxAttempts,
			})
		case endRelease:
			err = a.e.store.Release(ctx, a.key, a.lease, a.e.retention)
		}
		if !storekit.OutcomeUnknown(err) {
			return st, err
		}
		if r.pause == 0 {
			r = within(a.e.lease)
		}
		if !r.wait(ctx) {
			return st, err
		}
	}
}

// repeater paces the repetitions of a store call whose outcome is unknown:
// a pause that doubles from 10ms up to 1s, until a deadline (the ending
// calls: one lease) or a number of repetitions (acquisitions: three, within
// about 70ms, so that a store that is down still fails fast).
type repeater struct {
	deadline time.Time // zero: none
	left     int       // repetitions left; negative: no limit
	pause    time.Duration
}

// within returns a repeater that repeats for at most d.
func within(d time.Duration) repeater {
	return repeater{deadline: time.Now().Add(d), left: -1, pause: 10 * time.Millisecond}
}

// acquireRepeats is the repeater of an acquisition.
func acquireRepeats() repeater { return repeater{left: 3, pause: 10 * time.Millisecond} }

// wait pauses before the next repetition and reports whether there is one:
// false once the repetitions are used up, the next would start after the
// deadline, or ctx is done.
func (r *repeater) wait(ctx context.Context) bool {
	if r.left == 0 || (!r.deadline.IsZero() && !time.Now().Add(r.pause).Before(r.deadline)) {
		return false
	}
	r.left--
	t := time.NewTimer(r.pause)
	defer t.Stop()
	r.pause = min(2*r.pause, time.Second)
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// batch makes call for every element of a batch (idx nil), then repeats it
// for the elements whose outcome is unknown (idx lists them) while r
// allows. call returns one error per element it made. batch returns one
// error per element.
func (r *repeater) batch(ctx context.Context, call func(idx []int) []error) []error {
	errs := call(nil)
	for {
		var again []int
		for i, err := range errs {
			if storekit.OutcomeUnknown(err) {
				again = append(again, i)
			}
		}
		if len(again) == 0 || !r.wait(ctx) {
			return errs
		}
		for k, err := range call(again) {
			errs[again[k]] = err
		}
	}
}

// repeatUnknown makes a batch of store calls and repeats, with the same
// arguments, those whose error leaves the outcome unknown (storekit.OutcomeUnknown),
// as the Store contract allows, pausing from 10ms up to 1s, for at most d
// in all or until ctx is done. call(nil) makes the whole batch and returns
// one error per element; call(idx) makes again the elements listed in idx
// and returns one error per element of idx. repeatUnknown returns one error
// per element: the last answer of each. commitBatchWith does this with d =
// the lease.
func repeatUnknown(ctx context.Context, d time.Duration, call func(idx []int) []error) []error {
	r := within(d)
	return r.batch(ctx, call)
}
