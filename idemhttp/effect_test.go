package idemhttp_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestHandlerEffect: a handler attaches a Redis-side effect with
// idem.SetEffect(r.Context(), …); the effect is applied once, with the
// completion, and retries get the stored response.
func TestHandlerEffect(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.GoRedis(t)
	store, err := redisstore.New(rdb, redisstore.WithEffect("count", `redis.call('INCR', KEYS[1])`))
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(store)
	if err != nil {
		t.Fatal(err)
	}
	mw, err := idemhttp.New(exec)
	if err != nil {
		t.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := idem.SetEffect(r.Context(), idem.Effect{Name: "count", Keys: []string{"payments"}}); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
	}))
	for i := range 3 {
		req := httptest.NewRequest(http.MethodPost, "/payments", strings.NewReader(`{"amount":1}`))
		req.Header.Set("Idempotency-Key", "k1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusCreated || (i > 0) != (w.Header().Get("Idempotent-Replayed") == "true") {
			t.Fatalf("request %d: got %d, replayed %q", i+1, w.Code, w.Header().Get("Idempotent-Replayed"))
		}
	}
	if n, _ := rdb.Get(t.Context(), "payments").Int(); n != 1 {
		t.Fatalf("effect applied %d times, want 1", n)
	}
}
