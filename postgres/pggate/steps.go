package pggate

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/observe"
	"github.com/idemgo/idem/postgres/internal/pgq"
	"github.com/idemgo/idem/storekit"
)

// Errors of multi-step requests (Run, Complete). Test for them with
// errors.Is.
var (
	// ErrNotFlow is returned by Do, HTTP and Handle when the key's
	// completion row belongs to a multi-step request that has not
	// finished (see Run), and by Run when the row belongs to another flow.
	ErrNotFlow = errors.New("pggate: the key belongs to another kind of request (a multi-step request, or another flow)")

	// ErrClaimLost is returned by Run when another owner (a retry, the
	// completer) claimed the request's recovery point after this one did:
	// the step's transaction was rolled back. Retry with the same key.
	ErrClaimLost = errors.New("pggate: another owner took the multi-step request over; the step was rolled back")
)

// A Step is one named step of a Flow: either Local, a write to the
// gate's database that commits in its own transaction together with the
// recovery point, or Foreign, a call to another system that is given a key
// of its own to deduplicate by (see DerivedKey); its result, put in the
// State, is recorded by the next local step (or by the flow's end).
type Step[T any] struct {
	name    string
	local   func(ctx context.Context, tx T, s *State) error
	foreign func(ctx context.Context, key string, s *State) error
}

// Local returns a step that runs fn in a transaction of its own; the
// transaction also records that the step is done and the State as fn left
// it, so a retry resumes after it and never runs it again.
func Local[T any](name string, fn func(ctx context.Context, tx T, s *State) error) Step[T] {
	return Step[T]{name: name, local: fn}
}

// Foreign returns a step that calls another system. fn is given key, the
// step's derived idempotency key (DerivedKey: stable across retries and
// resumptions), which it must send with the call (an Idempotency-Key
// header): the step runs again when the process stops before the next
// local step recorded it, and the other system then replays its answer.
func Foreign[T any](name string, fn func(ctx context.Context, key string, s *State) error) Step[T] {
	return Step[T]{name: name, foreign: fn}
}

// Name returns the step's name.
func (s Step[T]) Name() string { return s.name }

// A Flow is a handler made of named steps that Gate.Run runs in order. Its
// name is recorded with the request, so that the completer (Gate.Complete)
// can find the flow registered under it (Gate.Register) and drive an
// abandoned request to its end. A Flow must not change once used: a
// request records the name of the last step it finished.
type Flow[T any] struct {
	Name  string
	Steps []Step[T]
}

// check validates f.
func (f *Flow[T]) check() error {
	if f == nil || f.Name == "" || len(f.Steps) == 0 {
		return fmt.Errorf("%w: a flow needs a name and steps", idem.ErrInvalid)
	}
	seen := map[string]bool{}
	for _, s := range f.Steps {
		if s.name == "" || seen[s.name] || (s.local == nil) == (s.foreign == nil) {
			return fmt.Errorf("%w: flow %q: step names must be unique and not empty, and each step Local or Foreign with a function", idem.ErrInvalid, f.Name)
		}
		seen[s.name] = true
	}
	return nil
}

// DerivedKey returns the idempotency key of the foreign step named step
// of the request whose store key is digest (idem.Key.Digest): the same for
// every retry and resumption of the request, different for every step and
// request, and free of the client's raw key.
func DerivedKey(digest, step string) string { return digest + "." + step }

// State holds the values a flow's steps hand to later steps, and its
// result. It is recorded with every local step (in the completion row), so
// a resumed request sees what the steps before it set. Values are bytes;
// keep them small. A State is used by one step at a time.
type State struct {
	Input  []byte            `json:"i,omitempty"`
	Values map[string][]byte `json:"v,omitempty"`
	Result []byte            `json:"r,omitempty"`
}

// Get returns the value set under name, or nil.
func (s *State) Get(name string) []byte { return s.Values[name] }

// Set sets the value under name.
func (s *State) Set(name string, v []byte) {
	if s.Values == nil {
		s.Values = map[string][]byte{}
	}
	s.Values[name] = v
}

// progress is what the completion row of an unfinished request holds in
// its column progress: the flow, the last step done, the State, the
// claim's owner and until when it holds, and, once the completer gave up,
// why.
type progress struct {
	Flow   string    `json:"flow"`
	Step   string    `json:"step"`
	State  State     `json:"state"`
	Owner  string    `json:"owner"`
	Fence  int64     `json:"fence"` // of the last attempt through the store (the completer reuses it)
	Until  time.Time `json:"until"`
	Failed string    `json:"failed,omitempty"`
}

// flowRow is a completion row as Run reads it.
type flowRow struct {
	found       bool
	fingerprint string
	finished    bool // progress is NULL: an ordinary completion
	p           progress
}

func (g *Gate[T]) readFlow(ctx context.Context, q pgq.Querier, digest string) (flowRow, error) {
	var r flowRow
	var fp, prog []byte
	err := q.QueryRow(ctx, `SELECT fingerprint, progress FROM idem_completions WHERE digest = $1 AND expires_at > now()`, digest).Scan(&fp, &prog)
	switch {
	case pgq.NoRows(err):
		return r, nil
	case err != nil:
		return r, insertErr(err)
	}
	r.found, r.fingerprint, r.finished = true, string(fp), prog == nil
	if prog != nil {
		if err := json.Unmarshal(prog, &r.p); err != nil {
			return r, fmt.Errorf("pggate: the recovery point of %s: %w", digest, err)
		}
	}
	return r, nil
}

// Run runs the flow f for key: its steps in order, each local step in a
// transaction of its own that also records the recovery point (the step's
// name and the State) in the key's completion row, each foreign step with
// its derived key (DerivedKey). The last step's transaction completes the
// row with the State's Result, as Do's would, and the store gets the
// completion. input is handed to the steps as State.Input (and recorded,
// so a resumption sees it).
//
// A retry with the same key resumes after the last recorded step; a
// finished request replays its result (Replayed set); a request the
// completer gave up on returns an *idem.FailedError with the reason. A
// request claimed by another owner whose claim still holds returns an
// *idem.InProgressError. The Executor's errors (a replay from the store,
// an *idem.InProgressError, idem.ErrMismatch) are returned as Do returns
// them.
//
// A step's error ends the run: a terminal one (idem.IsTerminal) marks the
// request failed (the row and the store); any other releases the key, so
// that a retry, or the completer, resumes at the same point. If another
// owner took the request over while a step ran, the step's transaction is
// rolled back and Run returns ErrClaimLost.
//
// A claim holds for the Executor's lease from the last recorded step: a
// step that takes longer may see the completer resume the request beside
// it, which the claim's check makes safe for local steps (one of the two
// commits) and the derived key for foreign ones.
func (g *Gate[T]) Run(ctx context.Context, key idem.Key, fingerprint string, f *Flow[T], input []byte) (idem.Result, error) {
	if err := f.check(); err != nil {
		return idem.Result{}, err
	}
	actx, a, err := g.e.Begin(ctx, key, fingerprint)
	if err != nil {
		return idem.Result{}, err
	}
	if a.Replayed() {
		return idem.Result{Value: a.Value(), Replayed: true}, nil
	}
	sctx := context.WithoutCancel(ctx)
	r, err := g.readFlow(actx, g.db, a.Key())
	if err != nil {
		return idem.Result{}, errors.Join(err, a.Release(sctx))
	}
	switch {
	case r.found && r.finished:
		return g.replay(actx, a)
	case r.found && r.fingerprint != a.Fingerprint():
		_ = a.Abandon(sctx, observe.Mismatch)
		return idem.Result{}, idem.ErrMismatch
	case r.found && r.p.Flow != f.Name:
		return idem.Result{}, errors.Join(fmt.Errorf("%w: the request belongs to flow %q, not %q", ErrNotFlow, r.p.Flow, f.Name), a.Release(sctx))
	case r.found && r.p.Failed != "":
		reason := errors.New(r.p.Failed)
		a.SetLastTry() // FAILED whatever the failure policy
		return idem.Result{}, errors.Join(&idem.FailedError{Message: r.p.Failed}, a.Fail(sctx, reason))
	case r.found && time.Until(r.p.Until) > 0:
		_ = a.Release(sctx)
		return idem.Result{}, &idem.InProgressError{RetryAfter: time.Until(r.p.Until)}
	}
	var run flowRun[T]
	if r.found {
		run = flowRun[T]{g: g, f: f, digest: a.Key(), fp: a.Fingerprint(), lease: adapterkit.Lease(g.e), p: r.p, exists: true}
		if err := run.claim(actx); err != nil {
			return idem.Result{}, errors.Join(err, a.Release(sctx))
		}
	} else {
		run = flowRun[T]{g: g, f: f, digest: a.Key(), fp: a.Fingerprint(), lease: adapterkit.Lease(g.e),
			p: progress{Flow: f.Name, State: State{Input: input}, Owner: newOwner()}}
	}
	done := false
	defer func() {
		if !done { // a step panicked or called runtime.Goexit
			run.unclaim(sctx)
			_ = a.Release(sctx)
		}
	}()
	run.p.Fence = a.Lease().Fence
	blob, err := run.steps(actx, a.Lease().Fence)
	done = true
	if err != nil {
		if errors.Is(err, ErrClaimLost) {
			_ = a.Abandon(sctx, observe.LeaseLost)
			return idem.Result{}, err
		}
		if idem.IsTerminal(err) {
			run.fail(sctx, err.Error())
			a.SetLastTry() // FAILED whatever the failure policy
			return idem.Result{}, errors.Join(err, a.Fail(sctx, err))
		}
		run.unclaim(sctx)
		return idem.Result{}, errors.Join(err, a.Release(sctx))
	}
	_ = a.Abandon(sctx, observe.Executed)
	// The store gets the completion after the commit, pgstore too: the
	// steps' transactions do not complete its record (Do's does).
	g.relay(sctx, a.Key(), storekit.Completion{Fingerprint: a.Fingerprint(), Fence: a.Lease().Fence, Result: blob, Retention: adapterkit.Retention(g.e)})
	return idem.Result{Value: run.p.State.Result, Fence: a.Lease().Fence}, nil
}

// newOwner returns a new claim token.
func newOwner() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// flowRun is one owner's run of a flow's steps from its recovery point.
type flowRun[T any] struct {
	g      *Gate[T]
	f      *Flow[T]
	digest string
	fp     string
	lease  time.Duration
	p      progress // as recorded (Owner: this run's claim)
	exists bool     // the row exists
}

// claim takes the recorded request over: a new owner, its claim for a
// lease from now. It fails with ErrClaimLost when another owner claimed or
// moved it since it was read.
func (r *flowRun[T]) claim(ctx context.Context) error {
	prev := r.p.Owner
	r.p.Owner = newOwner()
	return r.update(ctx, r.g.db, prev, r.p.Step, r.lease)
}

// unclaim ends this run's claim (a step failed and will be retried), so a
// retry or the completer need not wait for it to run out. Best effort.
func (r *flowRun[T]) unclaim(ctx context.Context) {
	if r.exists {
		_ = r.update(ctx, r.g.db, r.p.Owner, r.p.Step, 0)
	}
}

// fail records reason as why the request stopped for good. Best effort:
// the store's FAILED record answers retries meanwhile.
func (r *flowRun[T]) fail(ctx context.Context, reason string) {
	if r.exists {
		r.p.Failed = reason
		_ = r.update(ctx, r.g.db, r.p.Owner, r.p.Step, 0)
	}
}

// update writes r.p, claimed for hold from now, where the row is still at
// step prevStep under the claim prevOwner.
func (r *flowRun[T]) update(ctx context.Context, q pgq.Querier, prevOwner, prevStep string, hold time.Duration) error {
	r.p.Until = time.Now().Add(hold)
	b, err := json.Marshal(r.p)
	if err != nil {
		return err
	}
	n, err := q.Exec(ctx, `UPDATE idem_completions SET progress = $3::text::jsonb
WHERE digest = $1 AND progress->>'owner' = $2 AND progress->>'step' = $4`, r.digest, prevOwner, string(b), prevStep)
	if err != nil {
		return insertErr(err)
	}
	if n == 0 {
		return ErrClaimLost
	}
	return nil
}

// steps runs the steps after the recovery point and returns the
// completion's stored form.
func (r *flowRun[T]) steps(ctx context.Context, fence int64) ([]byte, error) {
	start := 0
	if r.p.Step != "" {
		start = -1
		for i, s := range r.f.Steps {
			if s.name == r.p.Step {
				start = i + 1
			}
		}
		if start < 0 {
			return nil, idem.Terminal(fmt.Errorf("pggate: flow %q has no step %q, where the request stopped", r.f.Name, r.p.Step))
		}
	}
	for i := start; i < len(r.f.Steps); i++ {
		s := r.f.Steps[i]
		last := i == len(r.f.Steps)-1
		if s.foreign != nil {
			if err := s.foreign(ctx, DerivedKey(r.digest, s.name), &r.p.State); err != nil {
				return nil, fmt.Errorf("pggate: step %q: %w", s.name, err)
			}
			if !last {
				continue
			}
		}
		blob, err := r.local(ctx, s, last, fence)
		if err != nil || last {
			return blob, err
		}
	}
	// Nothing left to run (the last step was done before): finish.
	return r.local(ctx, Step[T]{name: r.f.Steps[len(r.f.Steps)-1].name}, true, fence)
}

// local runs step s's function (none for a foreign step that ends the
// flow) in a transaction that records s as the recovery point, or, when s
// is the last, completes the row; it returns the completion's stored form
// when it finished.
func (r *flowRun[T]) local(ctx context.Context, s Step[T], last bool, fence int64) ([]byte, error) {
	sctx := context.WithoutCancel(ctx)
	tx, handle, err := r.g.db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("pggate: begin: %w", err)
	}
	ended := false
	defer func() {
		if !ended {
			_ = tx.Rollback(sctx)
		}
	}()
	if s.local != nil {
		if err := s.local(ctx, handle, &r.p.State); err != nil {
			ended = true
			_ = tx.Rollback(sctx)
			return nil, fmt.Errorf("pggate: step %q: %w", s.name, err)
		}
	}
	ended = true
	prevStep, prevOwner := r.p.Step, r.p.Owner
	r.p.Step = s.name
	var blob []byte
	switch {
	case last:
		blob, err = adapterkit.EncodeResult(r.g.e, r.digest, r.p.State.Result)
		if err != nil {
			_ = tx.Rollback(sctx)
			return nil, idem.Terminal(err)
		}
		err = r.finish(ctx, tx, prevStep, prevOwner, blob, fence)
	case r.exists:
		err = r.update(ctx, tx, prevOwner, prevStep, r.lease)
	default:
		err = r.insert(ctx, tx)
	}
	if err != nil {
		_ = tx.Rollback(sctx)
		r.p.Step = prevStep
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		r.p.Step = prevStep
		// The outcome is unknown: a retry reads the row and resumes from
		// whichever point committed.
		return nil, fmt.Errorf("pggate: commit of step %q (it may have committed; retry with the same key): %w", s.name, err)
	}
	r.exists = true
	return blob, nil
}

// insert records the first local step: a new row, unfinished. It fails
// with ErrClaimLost when another owner inserted the key's row first.
func (r *flowRun[T]) insert(ctx context.Context, tx pgq.Tx) error {
	r.p.Until = time.Now().Add(r.lease)
	b, err := json.Marshal(r.p)
	if err != nil {
		return err
	}
	// relayed: an unfinished row has nothing for the relay to copy.
	n, err := tx.Exec(ctx, `INSERT INTO idem_completions AS c (digest, fingerprint, fence, result, expires_at, relayed, progress)
VALUES ($1, $2, 0, '', now() + $3 * interval '1 microsecond', true, $4::text::jsonb)
ON CONFLICT (digest) DO UPDATE SET fingerprint = excluded.fingerprint, fence = excluded.fence, result = excluded.result,
  created_at = excluded.created_at, expires_at = excluded.expires_at, relayed = excluded.relayed, progress = excluded.progress
WHERE c.expires_at <= now()`, r.digest, []byte(r.fp), adapterkit.Retention(r.g.e).Microseconds(), string(b))
	if err != nil {
		return insertErr(err)
	}
	if n == 0 {
		return ErrClaimLost
	}
	return nil
}

// finish completes the row as Do's insert would: the result, the fence,
// progress NULL, relayed false and created_at now (the store gets it next,
// and the relay after it).
func (r *flowRun[T]) finish(ctx context.Context, tx pgq.Tx, prevStep, prevOwner string, blob []byte, fence int64) error {
	if !r.exists {
		// One transaction for the whole request: Do's insert.
		n, err := tx.Exec(ctx, insertCompletion, r.digest, []byte(r.fp), fence, blob, adapterkit.Retention(r.g.e).Microseconds(), false)
		if err != nil {
			return insertErr(err)
		}
		if n == 0 {
			return ErrClaimLost
		}
		return nil
	}
	n, err := tx.Exec(ctx, `UPDATE idem_completions SET progress = NULL, result = $4, fence = $5, relayed = false, created_at = clock_timestamp()
WHERE digest = $1 AND progress->>'owner' = $2 AND progress->>'step' = $3`, r.digest, prevOwner, prevStep, blob, fence)
	if err != nil {
		return insertErr(err)
	}
	if n == 0 {
		return ErrClaimLost
	}
	return nil
}

// Register registers f with the gate's completer (Complete), which then
// drives the abandoned requests of the flow named f.Name to their end. Run
// needs no registration. Register a flow under one name once.
func (g *Gate[T]) Register(f *Flow[T]) error {
	if err := f.check(); err != nil {
		return err
	}
	g.flowsMu.Lock()
	defer g.flowsMu.Unlock()
	if g.flows == nil {
		g.flows = map[string]*Flow[T]{}
	}
	if _, ok := g.flows[f.Name]; ok {
		return fmt.Errorf("%w: flow %q is registered already", idem.ErrInvalid, f.Name)
	}
	g.flows[f.Name] = f
	return nil
}

func (g *Gate[T]) flow(name string) *Flow[T] {
	g.flowsMu.Lock()
	defer g.flowsMu.Unlock()
	return g.flows[name]
}

// abandoned is an unfinished request whose claim ran out.
type abandoned struct {
	digest  string
	fp      string
	p       progress
	overdue bool
}

// Complete is the completer: it finds the multi-step requests that were
// abandoned mid-way (unfinished, and the claim of their last owner ran
// out, for example because its process died) and drives each to its end
// with the flow registered under its name (Register), as a retry would:
// after the last recorded step, the foreign steps with their derived keys,
// the completion relayed to the store. A request unfinished longer than
// the give-up bound (WithGiveUpAfter) after its first step, or whose last
// step failed terminally, is marked failed with the reason; so is one
// whose flow is not registered here once it is past the bound (another
// process may have it registered until then). It returns how many
// requests it finished and failed. A step's error leaves the request for
// the next run. Several completers (every Gate runs one, see
// WithCompleteInterval) share the work: a request is claimed before it
// runs. Complete is safe for concurrent use.
func (g *Gate[T]) Complete(ctx context.Context) (finished, failed int, err error) {
	var rows []abandoned
	err = g.db.Query(ctx, `SELECT digest, fingerprint, progress, created_at < now() - $1 * interval '1 microsecond'
FROM idem_completions
WHERE progress IS NOT NULL AND NOT progress ? 'failed' AND (progress->>'until')::timestamptz < now() AND expires_at > now()
ORDER BY created_at LIMIT $2`, []any{g.cfg.giveUp.Microseconds(), g.cfg.batch}, func(r pgq.Row) error {
		var x abandoned
		var fp, prog []byte
		if err := r.Scan(&x.digest, &fp, &prog, &x.overdue); err != nil {
			return err
		}
		x.fp = string(fp)
		if err := json.Unmarshal(prog, &x.p); err != nil {
			return fmt.Errorf("the recovery point of %s: %w", x.digest, err)
		}
		rows = append(rows, x)
		return nil
	})
	if err != nil {
		return 0, 0, relayErr(err)
	}
	var errs []error
	for _, x := range rows {
		fin, fail, err := g.completeOne(ctx, x)
		if fin {
			finished++
		}
		if fail {
			failed++
		}
		if err != nil && !errors.Is(err, ErrClaimLost) {
			errs = append(errs, fmt.Errorf("%s: %w", x.digest, err))
		}
	}
	if len(errs) > 0 {
		return finished, failed, fmt.Errorf("pggate: completer: %w", errors.Join(errs...))
	}
	return finished, failed, nil
}

// completeOne claims the abandoned request x and finishes or fails it.
func (g *Gate[T]) completeOne(ctx context.Context, x abandoned) (finished, failed bool, err error) {
	f := g.flow(x.p.Flow)
	run := flowRun[T]{g: g, f: f, digest: x.digest, fp: x.fp, lease: adapterkit.Lease(g.e), p: x.p, exists: true}
	switch {
	case x.overdue:
		reason := fmt.Sprintf("pggate: the multi-step request was given up after %v, at step %q of flow %q", g.cfg.giveUp, x.p.Step, x.p.Flow)
		return false, true, run.failClaimed(ctx, reason)
	case f == nil:
		return false, false, nil // another process may have it registered
	}
	if err := run.claim(ctx); err != nil {
		return false, false, err
	}
	fence := max(x.p.Fence, 1)
	blob, err := run.steps(ctx, fence)
	switch {
	case errors.Is(err, ErrClaimLost):
		return false, false, err
	case err != nil && idem.IsTerminal(err):
		run.fail(ctx, err.Error())
		return false, true, nil
	case err != nil:
		run.unclaim(ctx)
		return false, false, err
	}
	g.relay(ctx, x.digest, storekit.Completion{Fingerprint: x.fp, Fence: fence, Result: blob, Retention: adapterkit.Retention(g.e)})
	return true, false, nil
}

// failClaimed claims the request and records reason as why it stopped.
func (r *flowRun[T]) failClaimed(ctx context.Context, reason string) error {
	prev := r.p.Owner
	r.p.Owner = newOwner()
	r.p.Failed = reason
	return r.update(ctx, r.g.db, prev, r.p.Step, 0)
}
