package idemhttp_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/keysource"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/observe"
)

// fakeRecorder records what the middleware asked of it; Record ends the
// attempt as the Postgres gate does.
type fakeRecorder struct {
	a         *idem.Attempt
	stored    []byte // returned by Record (an earlier run's response)
	recorded  []byte
	discarded int
}

func (f *fakeRecorder) Record(ctx context.Context, response []byte) ([]byte, error) {
	f.recorded = append([]byte{}, response...)
	if f.stored != nil {
		return f.stored, f.a.Abandon(ctx, observe.Abandoned)
	}
	return nil, f.a.Commit(ctx, response)
}

func (f *fakeRecorder) Discard(context.Context) { f.discarded++ }

// TestRecorder: a handler's Recorder gets the response to store instead
// of the middleware's own completion, or is discarded when the response is
// not stored; a response it reports as stored earlier is replayed.
func TestRecorder(t *testing.T) {
	ms, _ := memstore.New()
	e, _ := idem.New(ms)
	mw, err := idemhttp.New(e)
	if err != nil {
		t.Fatal(err)
	}
	if err := idemhttp.SetRecorder(t.Context(), &fakeRecorder{}); !errors.Is(err, idemhttp.ErrNoMiddleware) {
		t.Fatalf("SetRecorder outside the middleware: got %v", err)
	}
	var rec *fakeRecorder
	var earlier []byte // a stored response from another run, for the next request
	status := http.StatusCreated
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, _ := idem.AttemptFrom(r.Context())
		rec = &fakeRecorder{a: a, stored: earlier}
		if err := idemhttp.SetRecorder(r.Context(), rec); err != nil {
			t.Error(err)
		}
		if err := idemhttp.SetRecorder(r.Context(), rec); err == nil {
			t.Error("a second SetRecorder succeeded")
		}
		w.WriteHeader(status)
		fmt.Fprint(w, "mine")
	}))
	do := func(key string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/", nil)
		r.Header.Set(keysource.DefaultHeader, key)
		h.ServeHTTP(w, r)
		return w
	}
	// Stored: Record gets the response, the client gets it.
	if w := do("a"); w.Code != http.StatusCreated || w.Body.String() != "mine" || rec.recorded == nil || rec.discarded != 0 {
		t.Fatalf("stored: got %d %q, recorded %v, discarded %d", w.Code, w.Body.String(), rec.recorded != nil, rec.discarded)
	}
	// Not stored (503 releases the key): Discard, not Record.
	status = http.StatusServiceUnavailable
	if w := do("b"); w.Code != http.StatusServiceUnavailable || rec.recorded != nil || rec.discarded != 1 {
		t.Fatalf("released: got %d, recorded %v, discarded %d", w.Code, rec.recorded != nil, rec.discarded)
	}
	// An earlier run's response was recorded: the client gets it, replayed.
	status = http.StatusCreated
	earlier = rec0(t, mw)
	w := do("c")
	if w.Code != http.StatusAccepted || w.Body.String() != "theirs" || w.Header().Get(idemhttp.ReplayedHeader) != "true" {
		t.Fatalf("conflict: got %d %q %v, want the earlier 202 theirs, replayed", w.Code, w.Body.String(), w.Header())
	}
}

// rec0 returns a stored response (202 "theirs") as the middleware encodes
// it, by running a plain handler and reading the record.
func rec0(t *testing.T, _ *idemhttp.Middleware) []byte {
	t.Helper()
	ms, _ := memstore.New()
	e, _ := idem.New(ms)
	mw, _ := idemhttp.New(e)
	var key string
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a, _ := idem.AttemptFrom(r.Context())
		key = a.Key()
		w.WriteHeader(http.StatusAccepted)
		fmt.Fprint(w, "theirs")
	}))
	r := httptest.NewRequest(http.MethodPost, "/", nil)
	r.Header.Set(keysource.DefaultHeader, "x")
	h.ServeHTTP(httptest.NewRecorder(), r)
	rec, err := ms.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	v, err := adapterkit.DecodeResult(e, key, rec.Result)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
