package httpkit_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/idemhttp/httpkit"
	"github.com/idemgo/idem/memstore"
)

// TestEmptyPrincipal: without the option a request with no principal is
// refused before the handler; with it, it runs.
func TestEmptyPrincipal(t *testing.T) {
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(ms)
	if err != nil {
		t.Fatal(err)
	}
	nobody := idemhttp.WithPrincipal(func(*http.Request) string { return "" })
	for _, tt := range []struct {
		opts []idemhttp.Option
		want int
	}{
		{[]idemhttp.Option{nobody}, http.StatusBadRequest},
		{[]idemhttp.Option{nobody, httpkit.EmptyPrincipal(true), httpkit.StreamOnFlush(false), httpkit.StreamAll(false)}, http.StatusCreated},
	} {
		mw, err := idemhttp.New(exec, tt.opts...)
		if err != nil {
			t.Fatal(err)
		}
		h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) }))
		r := httptest.NewRequest("POST", "/pay", nil)
		r.Header.Set("Idempotency-Key", "k1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != tt.want {
			t.Errorf("%d options: got %d, want %d", len(tt.opts), w.Code, tt.want)
		}
	}
}

func TestDecodeResponseCorrupt(t *testing.T) {
	if _, err := httpkit.DecodeResponse([]byte("garbage")); !errors.Is(err, idem.ErrCorruptResult) {
		t.Errorf("DecodeResponse(garbage): got %v, want ErrCorruptResult", err)
	}
}
