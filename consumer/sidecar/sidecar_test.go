package sidecar_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/consumer/sidecar"
	"github.com/idemgo/idem/memstore"
)

func newProcessor(t *testing.T, opts ...consumer.Option) *consumer.Processor {
	t.Helper()
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(s, idem.WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	p, err := consumer.New(exec, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// TestStatuses: the handler's answer decides the message's fate; a 2xx
// is the stored result, and the request carries the key and fence.
func TestStatuses(t *testing.T) {
	for _, tc := range []struct {
		status int
		want   consumer.Action
	}{
		{200, consumer.Ack}, {204, consumer.Ack},
		{400, consumer.DeadLetter}, {404, consumer.DeadLetter}, {422, consumer.DeadLetter},
		{408, consumer.Retry}, {409, consumer.Retry}, {429, consumer.Retry},
		{500, consumer.Retry}, {503, consumer.Retry}, {302, consumer.Retry},
	} {
		t.Run(strconv.Itoa(tc.status), func(t *testing.T) {
			var gotKey, gotFence, gotBody string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				gotKey, gotFence = r.Header.Get(sidecar.HeaderKey), r.Header.Get(sidecar.HeaderFence)
				b, _ := io.ReadAll(r.Body)
				gotBody = string(b)
				w.Header().Set("Location", "/elsewhere")
				w.WriteHeader(tc.status)
				io.WriteString(w, "answer")
			}))
			defer srv.Close()
			h := &sidecar.Handler{URL: srv.URL}
			p := newProcessor(t, consumer.WithPassDuplicates())
			msgs := []consumer.Message{{Key: "k1", Deliveries: 1}}
			call := func(ctx context.Context, i int) error {
				return h.Call(ctx, sidecar.Delivery{Key: msgs[i].Key, Body: []byte(`{"a":1}`)})
			}
			got := p.Process(t.Context(), msgs, call)
			if got[0].Action != tc.want {
				t.Fatalf("got %v (%v), want %v", got[0].Action, got[0].Err, tc.want)
			}
			if gotKey != "k1" || gotFence == "" || gotBody != `{"a":1}` {
				t.Errorf("request: got key %q fence %q body %q, want k1, a fence and the body", gotKey, gotFence, gotBody)
			}
			var herr *sidecar.HandlerError
			if tc.want != consumer.Ack && (!errors.As(got[0].Err, &herr) || herr.Status != tc.status || string(herr.Body) != "answer") {
				t.Errorf("error: got %v, want a HandlerError with status %d and the body", got[0].Err, tc.status)
			}
			if tc.want != consumer.Ack {
				return
			}
			// A duplicate: passed on with Idempotent-Replayed and no fence;
			// its stored result is the first answer.
			var stored []byte
			got = p.Process(t.Context(), msgs, func(ctx context.Context, i int) error {
				stored, _ = consumer.DuplicateFrom(ctx)
				return call(ctx, i)
			})
			if got[0].Action != consumer.Ack || !got[0].Replayed || gotFence != "" {
				t.Errorf("duplicate: got %+v fence %q, want a replayed Ack without a fence", got[0], gotFence)
			}
			var res sidecar.Result
			if err := json.Unmarshal(stored, &res); err != nil || res.Status != tc.status || (tc.status != 204 && string(res.Body) != "answer") || res.Header.Get("Location") != "/elsewhere" {
				t.Errorf("stored result: got %s (%v), want status %d, body and headers", stored, err, tc.status)
			}
		})
	}
}

// TestTimeoutAndRefused: no answer within the timeout, and a connection
// refused until the timeout, are retried.
func TestTimeoutAndRefused(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	for name, h := range map[string]*sidecar.Handler{
		"timeout": {URL: srv.URL, Timeout: 50 * time.Millisecond},
		"refused": {URL: deadURL, Timeout: 200 * time.Millisecond},
	} {
		p := newProcessor(t)
		got := p.Process(t.Context(), []consumer.Message{{Key: "k", Deliveries: 1}}, func(ctx context.Context, i int) error {
			return h.Call(ctx, sidecar.Delivery{Key: "k"})
		})
		if got[0].Action != consumer.Retry {
			t.Errorf("%s: got %v (%v), want retry", name, got[0].Action, got[0].Err)
		}
	}
}

// TestLeaseLostCancelsAndCalls: a lost lease cancels the handler's
// request (its connection closes) and the lease-lost URL gets the key,
// the fence and the reason.
func TestLeaseLostCancelsAndCalls(t *testing.T) {
	cancelled := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-r.Context().Done()
		close(cancelled)
	}))
	defer srv.Close()
	var mu sync.Mutex
	var lost []sidecar.LeaseLost
	var lostFence string
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var l sidecar.LeaseLost
		json.NewDecoder(r.Body).Decode(&l)
		mu.Lock()
		lost, lostFence = append(lost, l), r.Header.Get(sidecar.HeaderFence)
		mu.Unlock()
	}))
	defer hook.Close()
	h := &sidecar.Handler{URL: srv.URL, LeaseLostURL: hook.URL}
	s, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(s, idem.WithLease(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	p, err := consumer.New(exec, consumer.WithOnLeaseLost(h.OnLeaseLost))
	if err != nil {
		t.Fatal(err)
	}
	var fence int64
	got := p.Process(t.Context(), []consumer.Message{{Key: "k", Deliveries: 1}}, func(ctx context.Context, i int) error {
		fence, _ = idem.FenceFrom(ctx)
		// Another owner takes the key over: delete the record, as an
		// operator's idem rm would, and begin it again elsewhere.
		if err := s.Delete(context.Background(), p.Key("k").Digest()); err != nil {
			t.Error(err)
		}
		if _, _, err := exec.Begin(context.Background(), p.Key("k"), ""); err != nil {
			t.Error(err)
		}
		return h.Call(ctx, sidecar.Delivery{Key: "k"})
	})
	select {
	case <-cancelled:
	case <-time.After(10 * time.Second):
		t.Fatal("the handler's request was not cancelled")
	}
	if got[0].Action != consumer.Retry || !errors.Is(got[0].Err, idem.ErrLeaseLost) {
		t.Errorf("got %v (%v), want a retry for the lost lease", got[0].Action, got[0].Err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lost) != 1 || lost[0].Key != "k" || lost[0].Fence != fence || lost[0].Reason == "" || lostFence != strconv.FormatInt(fence, 10) {
		t.Errorf("lease-lost calls: got %+v (fence header %q), want one for key k fence %d with a reason", lost, lostFence, fence)
	}
}

// TestBrokenConnectionSameFence: a handler that dies after it applied a
// call (its connection closed before the answer) and answers when it is
// back gets the call again with the same fence, in the same attempt, so
// that its fence check sees its own fence (already applied), not a higher
// one; the message is acked with the second answer. With a gate whose row
// committed meanwhile, the call is not sent again.
func TestBrokenConnectionSameFence(t *testing.T) {
	for _, gated := range []bool{false, true} {
		t.Run(map[bool]string{false: "fence", true: "gate"}[gated], func(t *testing.T) {
			var mu sync.Mutex
			var fences []string
			g := &fakeGate{}
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				mu.Lock()
				fences = append(fences, r.Header.Get(sidecar.HeaderFence))
				first := len(fences) == 1
				mu.Unlock()
				if first { // applied (its row committed), then killed before its answer
					g.commit(r.Header.Get(sidecar.HeaderDigest))
					conn, _, err := http.NewResponseController(w).Hijack()
					if err != nil {
						t.Error(err)
						return
					}
					conn.Close()
					return
				}
				io.WriteString(w, "done")
			}))
			defer srv.Close()
			h := &sidecar.Handler{URL: srv.URL}
			if gated {
				h.Gate = g
			}
			p := newProcessor(t)
			var fence int64
			got := p.Process(t.Context(), []consumer.Message{{Key: "k", Deliveries: 1}}, func(ctx context.Context, i int) error {
				fence, _ = idem.FenceFrom(ctx)
				return h.Call(ctx, sidecar.Delivery{Key: "k"})
			})
			if got[0].Action != consumer.Ack {
				t.Fatalf("got %v (%v), want ack", got[0].Action, got[0].Err)
			}
			mu.Lock()
			defer mu.Unlock()
			want := []string{strconv.FormatInt(fence, 10), strconv.FormatInt(fence, 10)}
			if gated {
				want = want[:1] // found committed: not sent again
			}
			if len(fences) != len(want) || fences[0] != want[0] || len(fences) > 1 && fences[1] != want[1] {
				t.Errorf("got calls with fences %q, want %q", fences, want)
			}
		})
	}
}

// fakeGate is a Gate with at most one row, committed by commit.
type fakeGate struct {
	mu     sync.Mutex
	digest string
}

func (g *fakeGate) commit(digest string) {
	g.mu.Lock()
	g.digest = digest
	g.mu.Unlock()
}

func (g *fakeGate) Committed(ctx context.Context, digest string) ([]byte, bool, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return []byte("row"), g.digest != "" && digest == g.digest, nil
}
