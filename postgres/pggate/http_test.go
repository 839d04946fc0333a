package pggate_test

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/keysource"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/jackc/pgx/v5"
)

// client does not reuse connections: net/http repeats a request that
// carries an Idempotency-Key on a reused connection that broke, which
// would hide the handler's panic in TestHTTPRollsBack.
var client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// post sends a POST with an idempotency key and returns the status, the
// body and whether it was replayed.
func post(t *testing.T, url, key string) (int, string, bool) {
	t.Helper()
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url, strings.NewReader(`{"amount":1000}`))
	req.Header.Set(keysource.DefaultHeader, key)
	res, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b), res.Header.Get(idemhttp.ReplayedHeader) == "true"
}

// TestHTTPThroughGate: an idemhttp handler commits its effect and its
// response through the gate. After each response the Redis record is
// deleted (record loss after the commit, as in a failover: the crash
// window in which Redis does not know of the commit); every retry runs the
// handler, which conflicts, rolls back, and the client gets the first
// response replayed: 1 effect row for 6 requests. The negative control
// (the same middleware, the effect committed by the handler outside the
// gate) writes a row and answers differently at every retry.
func TestHTTPThroughGate(t *testing.T) {
	const tries = 6
	for _, gated := range []bool{true, false} {
		t.Run(map[bool]string{true: "gate", false: "control"}[gated], func(t *testing.T) {
			v := newRedisEnv(t, 5*time.Second)
			mw, err := idemhttp.New(v.gate.Executor(), idemhttp.WithPolicy(idemhttp.ReleaseServerErrors))
			if err != nil {
				t.Fatal(err)
			}
			var runs atomic.Int64
			var h http.Handler
			if gated {
				h = v.gate.HTTP(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
					n := runs.Add(1)
					if _, err := tx.Exec(r.Context(), `INSERT INTO effects (key) VALUES ('order-1')`); err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusCreated)
					fmt.Fprintf(w, `{"run":%d}`, n)
				})
			} else {
				h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					n := runs.Add(1)
					if _, err := v.pool.Exec(r.Context(), `INSERT INTO effects (key) VALUES ('order-1')`); err != nil {
						http.Error(w, err.Error(), http.StatusInternalServerError)
						return
					}
					w.WriteHeader(http.StatusCreated)
					fmt.Fprintf(w, `{"run":%d}`, n)
				})
			}
			srv := httptest.NewServer(mw.Handler(h))
			defer srv.Close()
			bodies := map[string]int{}
			replays := 0
			for i := range tries {
				status, body, replayed := post(t, srv.URL+"/pay", "k1")
				if status != http.StatusCreated {
					t.Fatalf("request %d: got %d %s", i, status, body)
				}
				bodies[body]++
				if replayed {
					replays++
				}
				// Record loss after the commit: Redis forgets every record.
				v.srv.Do(t, "FLUSHALL")
			}
			rows, _ := v.counts(t)
			t.Logf("gated=%v: %d requests, handler runs %d, effect rows %d, distinct responses %v, replayed %d", gated, tries, runs.Load(), rows, bodies, replays)
			if runs.Load() != tries {
				t.Fatalf("the handler ran %d times, want %d (every retry must run it: the record was lost)", runs.Load(), tries)
			}
			if gated && (rows != 1 || len(bodies) != 1 || bodies[`{"run":1}`] != tries || replays != tries-1) {
				t.Fatalf("through the gate: %d effect rows, responses %v, %d replayed; want 1 row, {\"run\":1} %d times, %d replayed", rows, bodies, replays, tries, tries-1)
			}
			if !gated && rows != tries {
				t.Fatalf("negative control: %d effect rows, want %d (the test must see the duplicates)", rows, tries)
			}
		})
	}
}

// TestHTTPRollsBack: a response the middleware does not store rolls the
// transaction back (a 503, which releases the key; a panic); the retry
// commits once, and the next one is replayed from Redis without running.
func TestHTTPRollsBack(t *testing.T) {
	v := newRedisEnv(t, 5*time.Second)
	mw, err := idemhttp.New(v.gate.Executor())
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	srv := httptest.NewServer(mw.Handler(v.gate.HTTP(func(w http.ResponseWriter, r *http.Request, tx pgx.Tx) {
		n := runs.Add(1)
		if _, err := tx.Exec(r.Context(), `INSERT INTO effects (key) VALUES ('k')`); err != nil {
			t.Error(err)
		}
		switch n {
		case 1:
			http.Error(w, "busy", http.StatusServiceUnavailable)
		case 2:
			panic(http.ErrAbortHandler)
		default:
			w.WriteHeader(http.StatusCreated)
			fmt.Fprint(w, "ok")
		}
	})))
	defer srv.Close()
	if status, _, _ := post(t, srv.URL, "k"); status != http.StatusServiceUnavailable {
		t.Fatalf("first: got %d, want 503", status)
	}
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL, strings.NewReader(`{"amount":1000}`))
	req.Header.Set(keysource.DefaultHeader, "k")
	if res, err := client.Do(req); err == nil {
		res.Body.Close()
		t.Fatalf("second (panic): got %d, want the connection aborted", res.StatusCode)
	}
	if rows, _ := v.counts(t); rows != 0 {
		t.Fatalf("after a 503 and a panic: %d effect rows, want 0 (rolled back)", rows)
	}
	if status, body, replayed := post(t, srv.URL, "k"); status != http.StatusCreated || body != "ok" || replayed {
		t.Fatalf("third: got %d %q replayed=%v, want 201 ok", status, body, replayed)
	}
	if status, body, replayed := post(t, srv.URL, "k"); status != http.StatusCreated || body != "ok" || !replayed || runs.Load() != 3 {
		t.Fatalf("fourth: got %d %q replayed=%v after %d runs, want the replay of 201 ok after 3 runs", status, body, replayed, runs.Load())
	}
	if rows, _ := v.counts(t); rows != 1 {
		t.Fatalf("effect rows: got %d, want 1", rows)
	}
}

// TestHTTPOutsideMiddleware: without the middleware's attempt the handler
// does not run and the answer is 500.
func TestHTTPOutsideMiddleware(t *testing.T) {
	v := newRedisEnv(t, 5*time.Second)
	ran := false
	rec := httptest.NewRecorder()
	v.gate.HTTP(func(http.ResponseWriter, *http.Request, pgx.Tx) { ran = true }).ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/", nil))
	if rec.Code != http.StatusInternalServerError || ran || !strings.Contains(rec.Body.String(), pggate.ErrNoAttempt.Error()) {
		t.Fatalf("got %d %q, ran %v; want 500 naming idemhttp, not run", rec.Code, rec.Body.String(), ran)
	}
}
