package idemhttp_test

import (
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/memstore"
)

// A payment is created once, however often the client retries it with the
// same key.
func Example() {
	store, err := memstore.New()
	if err != nil {
		log.Fatal(err)
	}
	exec, err := idem.New(store)
	if err != nil {
		log.Fatal(err)
	}
	mw, err := idemhttp.New(exec)
	if err != nil {
		log.Fatal(err)
	}

	var charges atomic.Int64
	mux := http.NewServeMux()
	mux.Handle("POST /payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := charges.Add(1) // the side effect
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":"pay_%d"}`, n)
	})))

	for range 2 {
		r := httptest.NewRequest("POST", "/payments", strings.NewReader(`{"amount":1000}`))
		r.Header.Set("Idempotency-Key", "order-17")
		w := httptest.NewRecorder()
		mux.ServeHTTP(w, r)
		fmt.Println(w.Code, w.Body.String(), "replayed:", w.Header().Get("Idempotent-Replayed") == "true")
	}
	fmt.Println("charges:", charges.Load())
	// Output:
	// 201 {"id":"pay_1"} replayed: false
	// 201 {"id":"pay_1"} replayed: true
	// charges: 1
}

// Keys are scoped by principal: two clients that happen to send the same key
// get their own responses.
func ExampleWithPrincipal() {
	store, _ := memstore.New()
	exec, _ := idem.New(store)
	mw, err := idemhttp.New(exec, idemhttp.WithPrincipal(func(r *http.Request) string {
		// In a real service: the authenticated user, from the context that
		// the authentication middleware filled in.
		user, _, _ := r.BasicAuth()
		return user
	}))
	if err != nil {
		log.Fatal(err)
	}
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, _, _ := r.BasicAuth()
		fmt.Fprintf(w, "order for %s", user)
	}))
	for _, user := range []string{"alice", "bob", "alice"} {
		r := httptest.NewRequest("POST", "/orders", nil)
		r.SetBasicAuth(user, "secret")
		r.Header.Set("Idempotency-Key", "1")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Body.String())
	}
	// Output:
	// order for alice
	// order for bob
	// order for alice
}

// A request whose key is in use gets 409 with Retry-After; a request that
// reuses a key for another body gets 422. Both are problem details.
func ExampleWriteProblem() {
	store, _ := memstore.New()
	exec, _ := idem.New(store)
	mw, _ := idemhttp.New(exec)
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	for _, body := range []string{`{"amount":1}`, `{"amount":2}`} {
		r := httptest.NewRequest("POST", "/payments", strings.NewReader(body))
		r.Header.Set("Idempotency-Key", "k")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		fmt.Println(w.Code)
		if w.Code >= 400 {
			fmt.Println(w.Header().Get("Content-Type"))
			fmt.Println(w.Body.String())
		}
	}
	// Output:
	// 201
	// 422
	// application/problem+json
	// {"type":"urn:idem:problem:key-mismatch","title":"Idempotency key reused","status":422,"detail":"The idempotency key was already used for a different request (method, path, query or body). Use a new key for a new request."}
}

// Hooks see every outcome with its duration: count them in your metrics.
func ExampleWithHook() {
	store, _ := memstore.New()
	exec, _ := idem.New(store)
	var outcomes []string
	mw, _ := idemhttp.New(exec, idemhttp.WithHook(func(r *http.Request, e idemhttp.Event) {
		outcomes = append(outcomes, fmt.Sprintf("%s %d", e.Outcome, e.Status))
	}))
	h := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	for _, key := range []string{"a", "a", ""} {
		r := httptest.NewRequest("POST", "/", nil)
		if key != "" {
			r.Header.Set("Idempotency-Key", key)
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
	}
	fmt.Println(strings.Join(outcomes, ", "))
	// Output:
	// executed 200, replayed 200, rejected 400
}

// A policy may decide per route: here, handlers that run in one database
// transaction leave nothing behind when they fail, so their 5xx responses
// release the key.
func ExampleWithPolicy() {
	store, _ := memstore.New()
	exec, _ := idem.New(store)
	mw, _ := idemhttp.New(exec, idemhttp.WithPolicy(func(r *http.Request, status int) idemhttp.Decision {
		if r.Pattern == "POST /transfers" {
			return idemhttp.ReleaseServerErrors(r, status)
		}
		return idemhttp.DefaultPolicy(r, status)
	}))
	calls := 0
	fail := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		w.WriteHeader(http.StatusInternalServerError)
	}))
	mux := http.NewServeMux()
	mux.Handle("POST /transfers", fail)
	mux.Handle("POST /emails", fail)
	for _, path := range []string{"/transfers", "/emails"} {
		calls = 0
		for range 2 {
			r := httptest.NewRequest("POST", path, nil)
			r.Header.Set("Idempotency-Key", "k")
			mux.ServeHTTP(httptest.NewRecorder(), r)
		}
		fmt.Println(path, "ran", calls, "times")
	}
	// Output:
	// /transfers ran 2 times
	// /emails ran 1 times
}
