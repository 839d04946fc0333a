package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idemgo/idem/internal/redistest"
)

// TestFloor: with each client, the floor runs the handler once per key,
// stores the response before sending it, and answers the key's next
// request with the stored body: its rows measure the two round trips they
// claim to, not a shortcut.
func TestFloor(t *testing.T) {
	srv := redistest.Start(t)
	gr := srv.GoRedis(t)
	ru := srv.Rueidis(t)
	for _, c := range []struct {
		name  string
		store floorStore
	}{{"go-redis", floorGoRedis{gr}}, {"rueidis", floorRueidis{ru}}} {
		t.Run(c.name, func(t *testing.T) {
			var runs atomic.Int32
			h := floorMiddleware(c.store, "floor-"+c.name+":", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				// The response is stored before it is sent.
				if got, err := gr.Get(r.Context(), "floor-"+c.name+":k").Result(); err != nil || got != floorClaim {
					t.Errorf("during the handler the key holds %q, %v; want the claim", got, err)
				}
				runs.Add(1)
				w.WriteHeader(http.StatusCreated)
				io.WriteString(w, `{"n":1}`)
			}))
			for i := range 3 {
				rec := httptest.NewRecorder()
				req := httptest.NewRequest("POST", "/", strings.NewReader("{}"))
				req.Header.Set("Idempotency-Key", "k")
				h.ServeHTTP(rec, req)
				if rec.Body.String() != `{"n":1}` {
					t.Fatalf("request %d: body %q", i, rec.Body.String())
				}
				if i == 0 && rec.Code != http.StatusCreated {
					t.Fatalf("first request: status %d, want 201", rec.Code)
				}
			}
			if n := runs.Load(); n != 1 {
				t.Fatalf("the handler ran %d times for one key, want 1", n)
			}
			if got, _ := gr.Get(t.Context(), "floor-"+c.name+":k").Result(); got != `{"n":1}` {
				t.Fatalf("stored %q, want the body", got)
			}
		})
	}
}
