package statemachine

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/idemgo/idem/storekit"
)

const (
	now   = int64(1_000_000_000)
	lease = 30 * time.Second
	ret   = time.Hour
)

var (
	leaseUS = lease.Microseconds()
	retUS   = ret.Microseconds()
)

// inProgress is a record owned by "a" with fence 100 and a lease that ends
// at until.
func inProgress(until int64) *Record {
	return &Record{State: storekit.StateInProgress, Fingerprint: "fp", Owner: "a", Fence: 100, Attempts: 1,
		Created: 1, LeaseUntil: until, ExpiresAt: until + leaseUS + Grace}
}

func ended(state storekit.State, result string) *Record {
	r := &Record{State: state, Fingerprint: "fp", Fence: 100, Attempts: 2, Created: 1, ExpiresAt: now + 1}
	if result != "" {
		r.Result = []byte(result)
	}
	return r
}

// clone returns a deep copy of r, to check that a transition leaves its
// input alone.
func clone(r *Record) *Record {
	if r == nil {
		return nil
	}
	c := *r
	c.Result = append([]byte(nil), r.Result...)
	return &c
}

func unchanged(t *testing.T, before, after *Record) {
	t.Helper()
	if !reflect.DeepEqual(before, after) {
		t.Errorf("the transition modified its input:\n got %+v\nwant %+v", after, before)
	}
}

func TestAcquire(t *testing.T) {
	req := func(owner string, max int) storekit.AcquireRequest {
		return storekit.AcquireRequest{Fingerprint: "fp", Owner: owner, Lease: lease, Retention: ret, MaxAttempts: max}
	}
	taken := *inProgress(now - 1)
	taken.Owner, taken.Fence, taken.Attempts = "b", now, 2
	taken.LeaseUntil, taken.ExpiresAt = now+leaseUS, now+2*leaseUS+Grace
	reacquired := *ended(storekit.StateReleased, "")
	reacquired.State, reacquired.Owner, reacquired.Fence, reacquired.Attempts = storekit.StateInProgress, "b", now, 3
	reacquired.LeaseUntil, reacquired.ExpiresAt = now+leaseUS, now+2*leaseUS+Grace
	exhausted := *ended(storekit.StateReleased, "")
	exhausted.State, exhausted.ExpiresAt = storekit.StateFailed, now+retUS

	tests := []struct {
		name      string
		cur       *Record
		req       storekit.AcquireRequest
		lastFence int64
		want      *Record // nil: unchanged
		out       storekit.Acquisition
	}{
		{
			name: "new key", req: req("b", 0), lastFence: 5,
			want: &Record{State: storekit.StateInProgress, Fingerprint: "fp", Owner: "b", Fence: now, Attempts: 1, Created: now,
				LeaseUntil: now + leaseUS, ExpiresAt: now + 2*leaseUS + Grace},
			out: storekit.Acquisition{Outcome: storekit.Acquired, Lease: storekit.Lease{Owner: "b", Fence: now}, Attempts: 1},
		},
		{
			name: "new key, clock behind the last fence", req: req("b", 0), lastFence: now + 7,
			want: &Record{State: storekit.StateInProgress, Fingerprint: "fp", Owner: "b", Fence: now + 8, Attempts: 1, Created: now,
				LeaseUntil: now + leaseUS, ExpiresAt: now + 2*leaseUS + Grace},
			out: storekit.Acquisition{Outcome: storekit.Acquired, Lease: storekit.Lease{Owner: "b", Fence: now + 8}, Attempts: 1},
		},
		{
			name: "other fingerprint", cur: ended(storekit.StateCompleted, "r"),
			req: storekit.AcquireRequest{Fingerprint: "other", Owner: "b", Lease: lease, Retention: ret},
			out: storekit.Acquisition{Outcome: storekit.Mismatch},
		},
		{
			name: "completed", cur: ended(storekit.StateCompleted, "r"), req: req("b", 0),
			out: storekit.Acquisition{Outcome: storekit.Replay, State: storekit.StateCompleted, Result: []byte("r"), Attempts: 2},
		},
		{
			name: "failed", cur: ended(storekit.StateFailed, "why"), req: req("b", 0),
			out: storekit.Acquisition{Outcome: storekit.Replay, State: storekit.StateFailed, Result: []byte("why"), Attempts: 2},
		},
		{
			name: "owner again", cur: inProgress(now + 1), req: req("a", 0),
			out: storekit.Acquisition{Outcome: storekit.Acquired, Lease: storekit.Lease{Owner: "a", Fence: 100}, Attempts: 1},
		},
		{
			name: "other owner, lease live", cur: inProgress(now + 1500), req: req("b", 0),
			out: storekit.Acquisition{Outcome: storekit.InProgress, RetryAfter: 1500 * time.Microsecond, Attempts: 1},
		},
		{
			name: "other owner, lease ended", cur: inProgress(now - 1), req: req("b", 0), lastFence: 100,
			want: &taken,
			out:  storekit.Acquisition{Outcome: storekit.TakenOver, PreviousOwner: "a", Lease: storekit.Lease{Owner: "b", Fence: now}, Attempts: 2},
		},
		{
			name: "lease ends now", cur: inProgress(now), req: req("b", 0),
			want: func() *Record { r := taken; r.ExpiresAt = now + 2*leaseUS + Grace; return &r }(),
			out:  storekit.Acquisition{Outcome: storekit.TakenOver, PreviousOwner: "a", Lease: storekit.Lease{Owner: "b", Fence: now}, Attempts: 2},
		},
		{
			name: "released", cur: ended(storekit.StateReleased, ""), req: req("b", 3),
			want: &reacquired,
			out:  storekit.Acquisition{Outcome: storekit.Acquired, Lease: storekit.Lease{Owner: "b", Fence: now}, Attempts: 3},
		},
		{
			name: "released, attempts exhausted", cur: ended(storekit.StateReleased, ""), req: req("b", 2),
			want: &exhausted,
			out:  storekit.Acquisition{Outcome: storekit.Replay, State: storekit.StateFailed, Attempts: 2},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := clone(tt.cur)
			next, changed, out := Acquire(tt.cur, tt.req, now, tt.lastFence)
			unchanged(t, before, tt.cur)
			if !reflect.DeepEqual(out, tt.out) {
				t.Errorf("outcome:\n got %+v\nwant %+v", out, tt.out)
			}
			if changed != (tt.want != nil) {
				t.Fatalf("changed = %v, want %v", changed, tt.want != nil)
			}
			if changed && !reflect.DeepEqual(next, *tt.want) {
				t.Errorf("record:\n got %+v\nwant %+v", next, *tt.want)
			}
			if a, ok := Settled(tt.cur, tt.req, now); ok != !changed || (ok && !reflect.DeepEqual(a, tt.out)) {
				t.Errorf("Settled = %+v, %v; want the outcome when nothing changes", a, ok)
			}
		})
	}
}

// ownedCase is a call made under a lease: the record before it, the lease,
// and what it must leave: a new record, nothing (a repeated call), or an
// error wrapping storekit.ErrLeaseLost.
type ownedCase struct {
	name  string
	cur   *Record
	lease storekit.Lease
	want  *Record // nil: unchanged
	lost  bool
	state storekit.State // Fail's
}

var owner = storekit.Lease{Owner: "a", Fence: 100}

// lostCases are the calls every owned transition refuses.
func lostCases() []ownedCase {
	return []ownedCase{
		{name: "no record", lease: owner, lost: true},
		{name: "other owner", cur: inProgress(now + 1), lease: storekit.Lease{Owner: "b", Fence: 100}, lost: true},
		{name: "other fence", cur: inProgress(now + 1), lease: storekit.Lease{Owner: "a", Fence: 99}, lost: true},
		{name: "taken over", cur: func() *Record { r := inProgress(now + 1); r.Owner, r.Fence = "b", 101; return r }(), lease: owner, lost: true},
	}
}

func checkOwned(t *testing.T, tt ownedCase, fn func(cur *Record) (Record, bool, storekit.State, error)) {
	t.Helper()
	before := clone(tt.cur)
	next, changed, state, err := fn(tt.cur)
	unchanged(t, before, tt.cur)
	if tt.lost {
		if !errors.Is(err, storekit.ErrLeaseLost) || changed {
			t.Fatalf("got changed=%v err=%v, want ErrLeaseLost and no change", changed, err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if changed != (tt.want != nil) {
		t.Fatalf("changed = %v, want %v", changed, tt.want != nil)
	}
	if changed && !reflect.DeepEqual(next, *tt.want) {
		t.Errorf("record:\n got %+v\nwant %+v", next, *tt.want)
	}
	if state != tt.state {
		t.Errorf("state = %v, want %v", state, tt.state)
	}
}

// after returns inProgress(now+1) changed by fn.
func after(fn func(r *Record)) *Record {
	r := inProgress(now + 1)
	fn(r)
	return r
}

func TestComplete(t *testing.T) {
	tests := append(lostCases(),
		ownedCase{name: "owner", cur: inProgress(now + 1), lease: owner, want: after(func(r *Record) {
			r.State, r.Result, r.LeaseUntil, r.ExpiresAt = storekit.StateCompleted, []byte("res"), 0, now+retUS
		})},
		ownedCase{name: "lease ended, not taken over", cur: inProgress(now - 5), lease: owner, want: func() *Record {
			r := inProgress(now - 5)
			r.State, r.Result, r.LeaseUntil, r.ExpiresAt = storekit.StateCompleted, []byte("res"), 0, now+retUS
			return r
		}()},
		ownedCase{name: "repeated", cur: after(func(r *Record) { r.State, r.Result = storekit.StateCompleted, []byte("res") }), lease: owner},
		ownedCase{name: "completed with another result", cur: after(func(r *Record) { r.State, r.Result = storekit.StateCompleted, []byte("other") }), lease: owner, lost: true},
		ownedCase{name: "released", cur: after(func(r *Record) { r.State = storekit.StateReleased }), lease: owner, lost: true},
	)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkOwned(t, tt, func(cur *Record) (Record, bool, storekit.State, error) {
				next, changed, err := Complete(cur, tt.lease, []byte("res"), ret, now)
				return next, changed, 0, err
			})
		})
	}
}

func TestFail(t *testing.T) {
	run := func(name string, f storekit.Failure, tests []ownedCase) {
		for _, tt := range tests {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				checkOwned(t, tt, func(cur *Record) (Record, bool, storekit.State, error) {
					return Fail(cur, tt.lease, f, now)
				})
			})
		}
	}
	released := after(func(r *Record) { r.State, r.LeaseUntil, r.ExpiresAt = storekit.StateReleased, 0, now+retUS })
	failed := after(func(r *Record) {
		r.State, r.LeaseUntil, r.ExpiresAt, r.Result = storekit.StateFailed, 0, now+retUS, []byte("why")
	})
	run("retryable", storekit.Failure{Retention: ret, Result: []byte("why")}, append(lostCases(),
		ownedCase{name: "owner", cur: inProgress(now + 1), lease: owner, want: released, state: storekit.StateReleased},
		ownedCase{name: "repeated", cur: clone(released), lease: owner, state: storekit.StateReleased},
	))
	run("terminal", storekit.Failure{Terminal: true, Retention: ret, Result: []byte("why")}, append(lostCases(),
		ownedCase{name: "owner", cur: inProgress(now + 1), lease: owner, want: failed, state: storekit.StateFailed},
		ownedCase{name: "repeated", cur: clone(failed), lease: owner, state: storekit.StateFailed},
		ownedCase{name: "completed", cur: after(func(r *Record) { r.State = storekit.StateCompleted }), lease: owner, lost: true},
	))
	run("attempts exhausted", storekit.Failure{MaxAttempts: 1, Retention: ret, Result: []byte("why")}, []ownedCase{
		{name: "owner", cur: inProgress(now + 1), lease: owner, want: failed, state: storekit.StateFailed},
	})
	run("attempts left", storekit.Failure{MaxAttempts: 2, Retention: ret, Result: []byte("why")}, []ownedCase{
		{name: "owner", cur: inProgress(now + 1), lease: owner, want: released, state: storekit.StateReleased},
	})
}

func TestExtend(t *testing.T) {
	tests := append(lostCases(),
		ownedCase{name: "owner", cur: inProgress(now + 1), lease: owner, want: after(func(r *Record) {
			r.LeaseUntil, r.ExpiresAt = now+2*leaseUS, now+4*leaseUS+Grace
		})},
		ownedCase{name: "released", cur: after(func(r *Record) { r.State = storekit.StateReleased }), lease: owner, lost: true},
	)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkOwned(t, tt, func(cur *Record) (Record, bool, storekit.State, error) {
				next, err := Extend(cur, tt.lease, 2*lease, now)
				return next, err == nil, 0, err
			})
		})
	}
}

func TestRelease(t *testing.T) {
	released := after(func(r *Record) { r.State, r.LeaseUntil, r.ExpiresAt = storekit.StateReleased, 0, now+retUS })
	tests := append(lostCases(),
		ownedCase{name: "owner", cur: inProgress(now + 1), lease: owner, want: released},
		ownedCase{name: "repeated", cur: clone(released), lease: owner},
		ownedCase{name: "completed", cur: after(func(r *Record) { r.State = storekit.StateCompleted }), lease: owner, lost: true},
	)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkOwned(t, tt, func(cur *Record) (Record, bool, storekit.State, error) {
				next, changed, err := Release(cur, tt.lease, ret, now)
				return next, changed, 0, err
			})
		})
	}
}

func TestRelay(t *testing.T) {
	c := storekit.Completion{Fingerprint: "fp2", Fence: 150, Result: []byte("relayed"), Retention: ret}
	completed := func(r *Record) *Record {
		r.State, r.Fingerprint, r.Owner, r.Result, r.LeaseUntil, r.ExpiresAt = storekit.StateCompleted, "fp2", "", []byte("relayed"), 0, now+retUS
		return r
	}
	tests := []struct {
		name string
		cur  *Record
		c    storekit.Completion
		want *Record // nil: unchanged
	}{
		{name: "no record", c: c, want: completed(&Record{Fence: 150, Attempts: 1, Created: now})},
		{name: "in progress", cur: inProgress(now + 1), c: c, want: completed(func() *Record { r := inProgress(now + 1); r.Fence = 150; return r }())},
		{name: "higher fence kept", cur: func() *Record { r := inProgress(now + 1); r.Fence = 200; return r }(), c: c,
			want: completed(func() *Record { r := inProgress(now + 1); r.Fence = 200; return r }())},
		{name: "released", cur: ended(storekit.StateReleased, ""), c: c, want: completed(func() *Record { r := ended(storekit.StateReleased, ""); r.Fence = 150; return r }())},
		{name: "failed", cur: ended(storekit.StateFailed, "why"), c: c, want: completed(func() *Record { r := ended(storekit.StateFailed, ""); r.Fence = 150; return r }())},
		{name: "completed: the first completion stays", cur: ended(storekit.StateCompleted, "first"), c: c},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := clone(tt.cur)
			next, changed := Relay(tt.cur, tt.c, now)
			unchanged(t, before, tt.cur)
			if changed != (tt.want != nil) {
				t.Fatalf("changed = %v, want %v", changed, tt.want != nil)
			}
			if changed && !reflect.DeepEqual(next, *tt.want) {
				t.Errorf("record:\n got %+v\nwant %+v", next, *tt.want)
			}
		})
	}
}

func TestCheckOwned(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	key := "k"
	tests := []struct {
		name  string
		ctx   context.Context
		key   string
		lease storekit.Lease
		what  string
		d     time.Duration
		want  error
	}{
		{"valid", context.Background(), key, owner, "retention", ret, nil},
		{"no duration", context.Background(), key, owner, "", 0, nil},
		{"bad key", context.Background(), "", owner, "", 0, storekit.ErrInvalid},
		{"bad lease", context.Background(), key, storekit.Lease{}, "", 0, storekit.ErrInvalid},
		{"bad duration", context.Background(), key, owner, "lease", 0, storekit.ErrInvalid},
		{"context ended", canceled, key, owner, "lease", time.Second, context.Canceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckOwned(tt.ctx, tt.key, tt.lease, tt.what, tt.d)
			if (tt.want == nil) != (err == nil) || (tt.want != nil && !errors.Is(err, tt.want)) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
}

func TestPublic(t *testing.T) {
	r := inProgress(now + 1)
	r.Result = []byte("x")
	p := r.Public(now)
	if p.State != storekit.StateInProgress || p.Fence != 100 || !p.LeaseUntil.Equal(time.UnixMicro(now+1)) || !p.Now.Equal(time.UnixMicro(now)) {
		t.Errorf("Public = %+v", p)
	}
	p.Result[0] = 'y'
	if string(r.Result) != "x" {
		t.Error("Public's result aliases the record's")
	}
	if p := ended(storekit.StateCompleted, "r").Public(now); !p.LeaseUntil.IsZero() {
		t.Errorf("a COMPLETED record has LeaseUntil %v", p.LeaseUntil)
	}
}

func TestCheckAcquireAndRelay(t *testing.T) {
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	ctx := context.Background()
	good := storekit.AcquireRequest{Fingerprint: "fp", Owner: "a", Lease: lease, Retention: ret}
	if err := CheckAcquire(ctx, "k", good); err != nil {
		t.Errorf("valid Acquire: %v", err)
	}
	if err := CheckAcquire(ctx, "", good); !errors.Is(err, storekit.ErrInvalid) {
		t.Errorf("empty key: got %v, want ErrInvalid", err)
	}
	if err := CheckAcquire(ctx, "k", storekit.AcquireRequest{Owner: "a", Retention: ret}); !errors.Is(err, storekit.ErrInvalid) {
		t.Errorf("zero lease: got %v, want ErrInvalid", err)
	}
	if err := CheckAcquire(canceled, "k", good); !errors.Is(err, context.Canceled) {
		t.Errorf("context ended: got %v, want context.Canceled", err)
	}
	c := storekit.Completion{Fingerprint: "fp", Fence: 1, Result: []byte("r"), Retention: ret}
	if err := CheckRelay(ctx, "k", c); err != nil {
		t.Errorf("valid relay: %v", err)
	}
	if err := CheckRelay(ctx, "", c); !errors.Is(err, storekit.ErrInvalid) {
		t.Errorf("empty key: got %v, want ErrInvalid", err)
	}
	if err := CheckRelay(ctx, "k", storekit.Completion{Fingerprint: "fp", Result: []byte("r"), Retention: ret}); !errors.Is(err, storekit.ErrInvalid) {
		t.Errorf("zero fence: got %v, want ErrInvalid", err)
	}
	if err := CheckRelay(canceled, "k", c); !errors.Is(err, context.Canceled) {
		t.Errorf("context ended: got %v, want context.Canceled", err)
	}
}

func TestParseState(t *testing.T) {
	for code, want := range map[string]storekit.State{"p": storekit.StateInProgress, "c": storekit.StateCompleted, "r": storekit.StateReleased, "f": storekit.StateFailed} {
		if got, ok := ParseState(code); !ok || got != want {
			t.Errorf("ParseState(%q) = %v, %v; want %v, true", code, got, ok, want)
		}
	}
	for _, code := range []string{"", "P", "x", "pc"} {
		if got, ok := ParseState(code); ok {
			t.Errorf("ParseState(%q) = %v, true; want false", code, got)
		}
	}
}
