package idemgrpc_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem/idemgrpc"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func errorInfo(t *testing.T, err error) (*errdetails.ErrorInfo, *errdetails.RetryInfo) {
	t.Helper()
	var info *errdetails.ErrorInfo
	var retry *errdetails.RetryInfo
	for _, d := range status.Convert(err).Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	return info, retry
}

// TestReplay: a retry with the same key gets the first call's response,
// header and trailer metadata, with idempotent-replayed: true, and the
// handler ran once, with a fence in its context.
func TestReplay(t *testing.T) {
	svc := newImpl()
	cc := dial(t, serve(t, svc, grpc.UnaryInterceptor(newServer(t, nil).UnaryServerInterceptor())))
	first, h1, t1, err := call(t, cc, charge, "k1", "a")
	if err != nil {
		t.Fatal(err)
	}
	again, h2, t2, err := call(t, cc, charge, "k1", "a")
	if err != nil {
		t.Fatal(err)
	}
	if again.GetValue() != first.GetValue() || first.GetValue() != "charged a" {
		t.Errorf("replay: got %q, want %q", again.GetValue(), first.GetValue())
	}
	if got := h2.Get(idemgrpc.ReplayedMetadata); len(got) != 1 || got[0] != "true" {
		t.Errorf("replay header %s: got %v, want [true]", idemgrpc.ReplayedMetadata, got)
	}
	if len(h1.Get(idemgrpc.ReplayedMetadata)) != 0 {
		t.Errorf("first call has %s", idemgrpc.ReplayedMetadata)
	}
	for _, md := range []struct {
		name     string
		first, r metadata.MD
		key      string
	}{{"header", h1, h2, "x-charge-id"}, {"trailer", t1, t2, "x-checksum"}} {
		if f, r := md.first.Get(md.key), md.r.Get(md.key); len(f) != 1 || len(r) != 1 || f[0] != r[0] {
			t.Errorf("%s %s: first %v, replay %v", md.name, md.key, f, r)
		}
	}
	if n := svc.runsOf("k1"); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
	if svc.fences[0] <= 0 {
		t.Errorf("fence in the handler's context: got %d, want > 0", svc.fences[0])
	}
}

// TestMismatch: the same key with another request is FailedPrecondition
// with an ErrorInfo and a PreconditionFailure naming the metadata key.
func TestMismatch(t *testing.T) {
	svc := newImpl()
	cc := dial(t, serve(t, svc, grpc.UnaryInterceptor(newServer(t, nil).UnaryServerInterceptor())))
	if _, _, _, err := call(t, cc, charge, "k", "a"); err != nil {
		t.Fatal(err)
	}
	_, _, _, err := call(t, cc, charge, "k", "b")
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("got %v, want FailedPrecondition", err)
	}
	if info, _ := errorInfo(t, err); info == nil || info.Reason != idemgrpc.ReasonReused {
		t.Errorf("ErrorInfo: got %v, want reason %s", info, idemgrpc.ReasonReused)
	}
	var pf *errdetails.PreconditionFailure
	for _, d := range status.Convert(err).Details() {
		if d, ok := d.(*errdetails.PreconditionFailure); ok {
			pf = d
		}
	}
	if pf == nil || len(pf.Violations) != 1 || pf.Violations[0].Subject != idemgrpc.DefaultKeyMetadata {
		t.Errorf("PreconditionFailure: got %v", pf)
	}
	if n := svc.total(); n != 1 {
		t.Errorf("handler ran %d times, want 1", n)
	}
}

// TestCoverage: a covered method without a key is InvalidArgument (or runs,
// with WithKeyOptional); a method not covered runs every time.
func TestCoverage(t *testing.T) {
	svc := newImpl()
	cc := dial(t, serve(t, svc, grpc.UnaryInterceptor(newServer(t, nil).UnaryServerInterceptor())))
	if _, _, _, err := call(t, cc, charge, "", "a"); status.Code(err) != codes.InvalidArgument {
		t.Errorf("covered, no key: got %v, want InvalidArgument", err)
	}
	for range 2 {
		if _, _, _, err := call(t, cc, uncovered, "k", "a"); err != nil {
			t.Fatal(err)
		}
	}
	if n := svc.runsOf("k"); n != 2 {
		t.Errorf("uncovered method ran %d times, want 2", n)
	}
	svc2 := newImpl()
	cc2 := dial(t, serve(t, svc2, grpc.UnaryInterceptor(newServer(t, nil, idemgrpc.WithKeyOptional(true)).UnaryServerInterceptor())))
	if _, _, _, err := call(t, cc2, charge, "", "a"); err != nil {
		t.Errorf("WithKeyOptional, no key: got %v, want the handler's answer", err)
	}
	// No method is covered by default.
	s, _ := idemgrpc.New(mustExec(t))
	svc3 := newImpl()
	cc3 := dial(t, serve(t, svc3, grpc.UnaryInterceptor(s.UnaryServerInterceptor())))
	for range 2 {
		if _, _, _, err := call(t, cc3, charge, "k", "a"); err != nil {
			t.Fatal(err)
		}
	}
	if n := svc3.runsOf("k"); n != 2 {
		t.Errorf("default coverage: ran %d times, want 2 (no method covered)", n)
	}
}

// TestHandlerErrors: a terminal status is stored and replayed with its
// details; a transient one (Unavailable) releases the key and the retry
// runs the handler again.
func TestHandlerErrors(t *testing.T) {
	svc := newImpl()
	cc := dial(t, serve(t, svc, grpc.UnaryInterceptor(newServer(t, nil).UnaryServerInterceptor())))
	for _, tc := range []struct {
		code codes.Code
		runs int
	}{{codes.InvalidArgument, 1}, {codes.Internal, 1}, {codes.Unavailable, 2}, {codes.ResourceExhausted, 2}} {
		t.Run(tc.code.String(), func(t *testing.T) {
			key := "k-" + tc.code.String()
			var hdr metadata.MD
			for range 2 {
				_, h, _, err := call(t, cc, charge, key, "fail:"+strconv.Itoa(int(tc.code)))
				if status.Code(err) != tc.code {
					t.Fatalf("got %v, want %v", err, tc.code)
				}
				hdr = h
			}
			if n := svc.runsOf(key); n != tc.runs {
				t.Errorf("handler ran %d times, want %d", n, tc.runs)
			}
			if replayed := len(hdr.Get(idemgrpc.ReplayedMetadata)) > 0; replayed != (tc.runs == 1) {
				t.Errorf("second call replayed: %v, want %v", replayed, tc.runs == 1)
			}
		})
	}
}

// TestInProgress: a call whose key is in progress waits for the first
// call and gets its replay; with a short wait it gets Aborted with a
// RetryInfo.
func TestInProgress(t *testing.T) {
	for _, tc := range []struct {
		name string
		wait time.Duration
	}{{"waits", 10 * time.Second}, {"times out", 50 * time.Millisecond}} {
		t.Run(tc.name, func(t *testing.T) {
			svc := newImpl()
			cc := dial(t, serve(t, svc, grpc.UnaryInterceptor(newServer(t, nil, idemgrpc.WithWait(tc.wait)).UnaryServerInterceptor())))
			firstDone := make(chan error, 1)
			go func() {
				_, _, _, err := call(t, cc, charge, "k", "block")
				firstDone <- err
			}()
			<-svc.started
			type res struct {
				h   metadata.MD
				err error
			}
			second := make(chan res, 1)
			go func() {
				_, h, _, err := call(t, cc, charge, "k", "block")
				second <- res{h, err}
			}()
			if tc.wait < time.Second {
				r := <-second
				if status.Code(r.err) != codes.Aborted {
					t.Fatalf("got %v, want Aborted", r.err)
				}
				info, retry := errorInfo(t, r.err)
				if info == nil || info.Reason != idemgrpc.ReasonInProgress || retry == nil || retry.RetryDelay.AsDuration() <= 0 {
					t.Errorf("details: ErrorInfo %v, RetryInfo %v", info, retry)
				}
				close(svc.release)
				<-firstDone
				return
			}
			select {
			case r := <-second:
				t.Fatalf("the second call returned while the first ran: %v", r.err)
			case <-time.After(100 * time.Millisecond): // a negative check: nothing may come
			}
			close(svc.release)
			if err := <-firstDone; err != nil {
				t.Fatal(err)
			}
			r := <-second
			if r.err != nil || len(r.h.Get(idemgrpc.ReplayedMetadata)) != 1 {
				t.Fatalf("second call: %v, header %v; want the replay", r.err, r.h)
			}
			if n := svc.runsOf("k"); n != 1 {
				t.Errorf("handler ran %d times, want 1", n)
			}
		})
	}
}

// TestStoreDown: an unreachable store fails the call with Unavailable
// (fail closed), or runs it unprotected with WithFailOpen.
func TestStoreDown(t *testing.T) {
	store := downStore{mustStore(t)}
	svc := newImpl()
	cc := dial(t, serve(t, svc, grpc.UnaryInterceptor(newServer(t, store).UnaryServerInterceptor())))
	_, _, _, err := call(t, cc, charge, "k", "a")
	if info, _ := errorInfo(t, err); status.Code(err) != codes.Unavailable || info == nil || info.Reason != idemgrpc.ReasonStore {
		t.Fatalf("got %v, want Unavailable with reason %s", err, idemgrpc.ReasonStore)
	}
	if n := svc.total(); n != 0 {
		t.Errorf("handler ran %d times with the store down, want 0", n)
	}
	cc2 := dial(t, serve(t, svc, grpc.UnaryInterceptor(newServer(t, store, idemgrpc.WithFailOpen(true)).UnaryServerInterceptor())))
	if _, _, _, err := call(t, cc2, charge, "k", "a"); err != nil {
		t.Fatalf("fail open: %v", err)
	}
}

// TestPrincipal: the same key from two principals names two records.
func TestPrincipal(t *testing.T) {
	svc := newImpl()
	principal := func(ctx context.Context) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if u := md.Get("user"); len(u) == 1 {
			return u[0], nil
		}
		return "", errors.New("no user")
	}
	cc := dial(t, serve(t, svc, grpc.UnaryInterceptor(newServer(t, nil, idemgrpc.WithPrincipal(principal)).UnaryServerInterceptor())))
	for _, user := range []string{"alice", "bob", "alice"} {
		ctx := metadata.AppendToOutgoingContext(t.Context(), "user", user, idemgrpc.DefaultKeyMetadata, "k")
		if err := cc.Invoke(ctx, charge, wrapString("a"), wrapString("")); err != nil {
			t.Fatal(err)
		}
	}
	if n := svc.runsOf("k"); n != 2 {
		t.Errorf("handler ran %d times, want 2 (one per principal)", n)
	}
	if _, _, _, err := call(t, cc, charge, "k2", "a"); status.Code(err) != codes.Unauthenticated {
		t.Errorf("principal error: got %v, want Unauthenticated", err)
	}
}

// TestStreamRefused: a stream of a covered method with a key is refused.
func TestStreamRefused(t *testing.T) {
	s := newServer(t, nil, idemgrpc.WithMethods(streamM))
	cc := dial(t, serve(t, newImpl(), grpc.StreamInterceptor(s.StreamServerInterceptor())))
	ctx := metadata.AppendToOutgoingContext(t.Context(), idemgrpc.DefaultKeyMetadata, "k")
	st, err := cc.NewStream(ctx, &serviceDesc.Streams[0], streamM)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.RecvMsg(wrapString("")); status.Code(err) != codes.Unimplemented {
		t.Errorf("got %v, want Unimplemented", err)
	}
	st, err = cc.NewStream(t.Context(), &serviceDesc.Streams[0], streamM)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.RecvMsg(wrapString("")); status.Code(err) == codes.Unimplemented {
		t.Errorf("a stream without a key: got %v", err)
	}
}
