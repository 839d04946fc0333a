package serving

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idemgo/idem/idemproxy"
)

func TestAdminMux(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "idem_test_total", Help: "a test counter"})
	reg.MustRegister(c)
	var readyErr error
	h := AdminMux(reg, func(context.Context) error { return readyErr })
	get := func(path string) (int, string) {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest("GET", path, nil))
		b, _ := io.ReadAll(w.Result().Body)
		return w.Code, string(b)
	}
	for _, tt := range []struct {
		path  string
		ready error
		code  int
		body  string
	}{
		{"/healthz", errors.New("down"), 200, "ok\n"},
		{"/readyz", nil, 200, "ready\n"},
		{"/readyz", fmt.Errorf("stopping: %w", idemproxy.ErrDraining), 503, "not ready: shutting down\n"},
		{"/readyz", errors.New("dial tcp: connection refused"), 503, "not ready: dial tcp: connection refused\n"},
		{"/metrics", nil, 200, "idem_test_total 0"},
	} {
		readyErr = tt.ready
		code, body := get(tt.path)
		if code != tt.code || !strings.Contains(body, tt.body) {
			t.Errorf("GET %s with ready %v: got %d %q, want %d %q", tt.path, tt.ready, code, body, tt.code, tt.body)
		}
	}
}
