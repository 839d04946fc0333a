package idemhttp_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/observe"
)

// TestObserverMatchesOutcomes checks that the Executor's Observer sees the
// middleware's requests, once each, with the scope kind "http" and the
// outcome that corresponds to the middleware's own.
func TestObserverMatchesOutcomes(t *testing.T) {
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	fs := &flakyStore{Store: ms}
	var mu sync.Mutex
	var seen []observe.Observation
	// A short lease: a failing completion is repeated for one.
	exec := newExecutor(t, fs, idem.WithLease(300*time.Millisecond), idem.WithObserver(func(_ context.Context, o observe.Observation) {
		mu.Lock()
		defer mu.Unlock()
		seen = append(seen, o)
	}))
	var events eventLog
	held := make(chan struct{})
	release := make(chan struct{})
	h := newMiddleware(t, exec, idemhttp.WithHook(events.hook)).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.Header.Get("X-Test") {
		case "hold":
			close(held)
			<-release
		case "break-store":
			fs.down.Store(true)
		}
		fmt.Fprint(w, "ok")
	}))
	steps := []struct {
		name, key, body, header string
		want                    idemhttp.Outcome
		observed                observe.Outcome
	}{
		{"new key", "a", "1", "", idemhttp.OutcomeExecuted, observe.Executed},
		{"same request", "a", "1", "", idemhttp.OutcomeReplayed, observe.Replayed},
		{"other body", "a", "2", "", idemhttp.OutcomeMismatch, observe.Mismatch},
		{"store failing while the handler runs", "b", "1", "break-store", idemhttp.OutcomeNotRecorded, observe.NotRecorded},
		{"store down", "c", "1", "", idemhttp.OutcomeStoreError, observe.StoreError},
	}
	for i, s := range steps {
		r := request(http.MethodPost, "/payments", s.key, s.body)
		if s.header != "" {
			r.Header.Set("X-Test", s.header)
		}
		serve(h, r)
		mu.Lock()
		got := seen
		seen = nil
		mu.Unlock()
		if e := events.get(i); e.Outcome != s.want {
			t.Fatalf("%s: got middleware outcome %v, want %v", s.name, e.Outcome, s.want)
		}
		if len(got) != 1 || got[0].Outcome != s.observed || got[0].ScopeKind != "http" {
			t.Fatalf("%s: got observations %+v, want one %v of kind http", s.name, got, s.observed)
		}
	}
	fs.down.Store(false)

	// A request in progress: the second gets 409, observed in progress.
	done := make(chan struct{})
	go func() {
		defer close(done)
		r := request(http.MethodPost, "/payments", "d", "1")
		r.Header.Set("X-Test", "hold")
		serve(h, r)
	}()
	<-held
	serve(h, request(http.MethodPost, "/payments", "d", "1"))
	close(release)
	<-done
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[0].Outcome != observe.InProgress || seen[1].Outcome != observe.Executed {
		t.Errorf("concurrent requests: got %+v, want in-progress then executed", seen)
	}
}
