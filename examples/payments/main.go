// Command payments is a small HTTP payments API made safe to retry with the
// idemhttp middleware: a client that retries POST /payments with the same
// Idempotency-Key is charged once and gets the first response again.
//
//	go run ./examples/payments
//
//	curl -i localhost:8080/payments -H 'Authorization: Bearer sk_alice' \
//	     -H 'Idempotency-Key: order-17' -d '{"amount":1000,"currency":"EUR"}'
//
// Run the curl command twice: the second response is the first one again,
// with Idempotent-Replayed: true, and GET /payments lists one payment. The
// same key with another body gets 422; without a key, 400.
//
// The store is memstore, which lives in this process; a service with several
// instances uses redisstore instead.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/memstore"
)

func main() {
	addr := flag.String("addr", "localhost:8080", "listen address")
	flag.Parse()
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))

	store, err := memstore.New()
	if err != nil {
		logger.Error("creating the store", "error", err)
		os.Exit(1)
	}
	h, err := newHandler(store, logger)
	if err != nil {
		logger.Error("creating the handler", "error", err)
		os.Exit(1)
	}
	srv := &http.Server{Addr: *addr, Handler: h, ReadHeaderTimeout: 5 * time.Second}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		srv.Shutdown(shutdown)
	}()
	logger.Info("listening", "addr", *addr)
	if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
		logger.Error("serving", "error", err)
		os.Exit(1)
	}
}

// newHandler returns the API's routes on store.
func newHandler(store idem.Store, logger *slog.Logger) (http.Handler, error) {
	exec, err := idem.New(store, idem.WithLease(10*time.Second))
	if err != nil {
		return nil, err
	}
	mw, err := idemhttp.New(exec,
		idemhttp.WithPrincipal(principal), // one client never sees another's response
		idemhttp.WithCanonicalJSON(true),  // key order and spacing do not count
		idemhttp.WithLogger(logger),
		idemhttp.WithHook(func(r *http.Request, e idemhttp.Event) {
			logger.Info("idempotency", "outcome", e.Outcome, "status", e.Status, "duration", e.Duration)
		}),
	)
	if err != nil {
		return nil, err
	}
	api := &api{}
	mux := http.NewServeMux()
	// Wrap the handler, not the mux, so that the middleware sees the route
	// pattern the mux matched.
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(api.create)))
	mux.HandleFunc("GET /payments", api.list)
	return authenticate(mux), nil
}

type payment struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Fence    int64  `json:"fence"`
}

type api struct {
	mu       sync.Mutex
	payments map[string][]payment // by principal
}

func (a *api) create(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Amount   int64  `json:"amount"`
		Currency string `json:"currency"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Amount <= 0 || req.Currency == "" {
		// Stored like any response: a retry with the same body gets the
		// same 400 without running the handler again.
		http.Error(w, "want a JSON body with a positive amount and a currency", http.StatusBadRequest)
		return
	}
	// The fence grows with every execution of a key: a payment provider or
	// database can reject a write from a stale execution with it.
	fence, _ := idem.FenceFrom(r.Context())
	a.mu.Lock()
	if a.payments == nil {
		a.payments = make(map[string][]payment)
	}
	user := principal(r)
	p := payment{ID: fmt.Sprintf("pay_%d", len(a.payments[user])+1), Amount: req.Amount, Currency: req.Currency, Fence: fence}
	a.payments[user] = append(a.payments[user], p)
	a.mu.Unlock()

	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/payments/"+p.ID)
	w.WriteHeader(http.StatusCreated)
	json.NewEncoder(w).Encode(p)
}

func (a *api) list(w http.ResponseWriter, r *http.Request) {
	a.mu.Lock()
	ps := append([]payment{}, a.payments[principal(r)]...)
	a.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(ps)
}

// principal returns the caller's API key. A real service would look the key
// up and return the account it belongs to.
func principal(r *http.Request) string {
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
}

// authenticate rejects requests without an API key, before the idempotency
// middleware runs.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasPrefix(r.Header.Get("Authorization"), "Bearer sk_") {
			w.Header().Set("WWW-Authenticate", "Bearer")
			http.Error(w, "missing API key", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
