package main

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/idemgo/idem/memstore"
)

func TestPayments(t *testing.T) {
	store, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	h, err := newHandler(store, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	send := func(method, token, key, body string) (int, string, http.Header) {
		t.Helper()
		req, _ := http.NewRequestWithContext(t.Context(), method, srv.URL+"/payments", strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		res, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b), res.Header
	}

	status, first, _ := send("POST", "sk_alice", "order-17", `{"amount":1000,"currency":"EUR"}`)
	if status != 201 || !strings.Contains(first, `"id":"pay_1"`) {
		t.Fatalf("create: got %d %s, want 201 pay_1", status, first)
	}
	// The retry, with the members in another order, is a replay.
	status, again, h2 := send("POST", "sk_alice", "order-17", `{"currency":"EUR", "amount":1000}`)
	if status != 201 || again != first || h2.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry: got %d %s %v, want the first response replayed", status, again, h2)
	}
	if status, _, _ := send("POST", "sk_alice", "order-17", `{"amount":5,"currency":"EUR"}`); status != 422 {
		t.Errorf("other body: got %d, want 422", status)
	}
	if status, _, _ := send("POST", "sk_alice", "", `{"amount":5,"currency":"EUR"}`); status != 400 {
		t.Errorf("no key: got %d, want 400", status)
	}
	// Bob's key of the same name is his own.
	if status, body, _ := send("POST", "sk_bob", "order-17", `{"amount":7,"currency":"USD"}`); status != 201 || !strings.Contains(body, `"amount":7`) {
		t.Errorf("bob: got %d %s, want his own payment", status, body)
	}
	if _, list, _ := send("GET", "sk_alice", "", ""); strings.Count(list, `"id"`) != 1 {
		t.Errorf("list: got %s, want one payment", list)
	}
}
