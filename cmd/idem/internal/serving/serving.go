// Package serving runs idem proxy's servers once they are built: serve
// until the context ends, drain (requests in flight finish and their
// responses are stored, slow readers' connections are closed), and the
// admin endpoints /metrics, /healthz and /readyz that idem proxy and idem
// consume share.
package serving

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idemgo/idem/cmd/idem/internal/certreload"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/storeopen"
	"github.com/idemgo/idem/idemproxy"
)

// Server is a built proxy: its servers, listening.
type Server struct {
	Proxy   *idemproxy.Proxy
	Log     *slog.Logger
	Srv     *http.Server
	Ln      net.Listener
	Admin   *http.Server // nil without --admin-listen
	AdminLn net.Listener
	Certs   *certreload.Reloader // nil without --tls-cert
	Started []any                // the attributes of the start's log line
}

// Serve serves until ctx is done, or the server fails.
func (s *Server) Serve(ctx context.Context) error {
	if s.Admin != nil {
		go s.Admin.Serve(s.AdminLn)
	}
	s.Log.Info("idem proxy started", s.Started...)
	serveErr := make(chan error, 1)
	if s.Certs != nil {
		s.Certs.Watch(ctx, time.Second)
		go func() { serveErr <- s.Srv.ServeTLS(s.Ln, "", "") }()
	} else {
		go func() { serveErr <- s.Srv.Serve(s.Ln) }()
	}
	select {
	case err := <-serveErr:
		return fmt.Errorf("serving on %s: %v", s.Ln.Addr(), err)
	case <-ctx.Done():
		return nil
	}
}

// Drain stops the servers: the requests in flight finish and their
// responses are stored, for up to timeout; then the connections of those
// still running (slow readers) are closed, and their handlers get another
// timeout to store what the upstream answered.
func (s *Server) Drain(timeout time.Duration) {
	s.Log.Info("idem proxy shutting down: finishing requests in flight", "in_flight", s.Proxy.InFlight(), "timeout", cli.FormatDuration(timeout))
	dctx, stop := context.WithCancel(context.Background())
	defer stop()
	drained := make(chan error, 1)
	go func() { drained <- s.Proxy.Drain(dctx) }() // /readyz answers 503 from now on
	sctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err := s.Srv.Shutdown(sctx)
	if err != nil {
		// Clients still being sent a response (slow readers) lose their
		// connection. The handlers go on: a response held for storing was
		// stored already; the rest of one being streamed is read from the
		// upstream, and its key stored or failed, before the store closes.
		s.Log.Warn("requests still in flight after the shutdown timeout; closing their connections and storing what the upstream answered",
			"in_flight", s.Proxy.InFlight(), "error", err)
		s.Srv.Close()
		t := time.NewTimer(timeout)
		defer t.Stop()
		select {
		case <-drained:
		case <-t.C:
			s.Log.Error("requests still in flight after closing their connections; their keys stay in progress until their leases end",
				"in_flight", s.Proxy.InFlight())
		}
	}
	if s.Admin != nil {
		actx, acancel := context.WithTimeout(context.Background(), time.Second)
		_ = s.Admin.Shutdown(actx)
		acancel()
	}
	s.Log.Info("idem proxy stopped", "clean", err == nil)
}

// AdminMux serves /metrics of reg, /healthz (the process runs) and /readyz:
// 200 when ready returns nil, else 503 saying why (idemproxy.ErrDraining:
// shutting down; any other error: the store's). idem proxy and idem
// consume serve the same probes.
func AdminMux(reg *prometheus.Registry, ready func(context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		switch err := ready(ctx); {
		case err == nil:
			fmt.Fprintln(w, "ready")
		case errors.Is(err, idemproxy.ErrDraining):
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: shutting down")
		default:
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintf(w, "not ready: %v\n", storeopen.Error(err))
		}
	})
	return mux
}
