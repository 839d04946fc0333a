package main

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/testkit/redistest"
	"github.com/stripe/stripe-go/v85"
)

// TestProxyStripeSDK: Stripe's Go SDK (stripe-go v85) through the proxy's
// stripe preset (--error-body stripe), in front of an upstream that speaks
// Stripe's API.
//
//   - A create sent while the first request with its key is still running:
//     stripe-go never retries a 409 it decoded (its own rule runs before
//     Stripe-Should-Retry), so the preset waits for the first request
//     (--wait of --lease by default) and the SDK gets its customer, the
//     upstream having run once. With --wait 0 (the preset before) the SDK
//     fails with the 409. The first request ends only once the SDK's
//     waits (it subscribed to the key's channel) or was answered.
//   - A key reused with other parameters: 400 idempotency_error, as Stripe
//     answers it (it was 422, which stripe-node reports as a generic
//     StripeAPIError).
func TestProxyStripeSDK(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		extra []string
		wait  bool // the SDK's create waits for the first request
	}{
		{"preset", nil, true},
		{"--wait 0", []string{"--wait", "0s"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			release := make(chan struct{})
			started := make(chan struct{}, 10)
			var runs atomic.Int64
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				r.ParseForm()
				n := runs.Add(1)
				started <- struct{}{}
				if r.Form.Get("name") == "slow" {
					<-release
				}
				w.Header().Set("Content-Type", "application/json")
				fmt.Fprintf(w, `{"id":"cus_%d","object":"customer","name":%q}`, n, r.Form.Get("name"))
			}))
			t.Cleanup(up.Close)
			t.Cleanup(func() {
				select {
				case <-release:
				default:
					close(release)
				}
			})
			srv := redistest.Start(t)
			p := startProxy(t, up.URL, []string{"--redis", "redis://" + srv.Addr()}, append([]string{"--error-body", "stripe", "--lease", "10s"}, tc.extra...)...)
			// A request that waits for a key subscribes to the key's
			// channel, named with the record's hash tag.
			waiting := func() bool { return srv.Do(t, "PUBSUB", "CHANNELS", "*{*}*") != "" }
			sc := stripe.NewClient("sk_test_idem", stripe.WithBackends(stripe.NewBackendsWithConfig(&stripe.BackendConfig{
				URL:               stripe.String(p.url("")),
				HTTPClient:        &http.Client{Timeout: 30 * time.Second},
				MaxNetworkRetries: stripe.Int64(2),
				LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
			})))
			create := func(key, name string) (*stripe.Customer, error) {
				params := &stripe.CustomerCreateParams{Name: stripe.String(name)}
				params.SetIdempotencyKey(key)
				return sc.V1Customers.Create(t.Context(), params)
			}

			// The first request with the key, the SDK's own form body.
			first := make(chan response, 1)
			go func() {
				first <- post(t, p.url("/v1/customers"), "cus-key", "name=slow", "Content-Type", "application/x-www-form-urlencoded")
			}()
			<-started
			got := make(chan error, 1)
			var cus *stripe.Customer
			go func() {
				var err error
				cus, err = create("cus-key", "slow")
				got <- err
			}()
			// The SDK's request waits for the first one, or it was
			// answered already; only then does the first one end.
			deadline := time.Now().Add(10 * time.Second)
			for len(got) == 0 && !waiting() {
				if time.Now().After(deadline) {
					t.Fatal("the SDK's request neither waits nor was answered")
				}
				time.Sleep(5 * time.Millisecond) // poll the server
			}
			close(release)
			err := <-got
			if res := <-first; res.status != 200 {
				t.Errorf("first request: got %d %s, want 200", res.status, res.body)
			}
			if tc.wait {
				if err != nil || cus.ID != "cus_1" {
					id := ""
					if cus != nil {
						id = cus.ID
					}
					t.Errorf("SDK create during the first request: got %q, %v, want cus_1 (replayed)", id, err)
				}
			} else {
				var se *stripe.Error
				if !errors.As(err, &se) || se.HTTPStatusCode != 409 || se.Type != stripe.ErrorTypeIdempotency {
					t.Errorf("SDK create during the first request with --wait 0: got %v, want a 409 idempotency_error", err)
				}
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("upstream runs: got %d, want 1", n)
			}

			_, err = create("cus-key", "other")
			var se *stripe.Error
			if !errors.As(err, &se) || se.HTTPStatusCode != 400 || se.Type != stripe.ErrorTypeIdempotency || se.Code != "key_mismatch" {
				t.Errorf("SDK create reusing the key with other parameters: got %v, want a 400 idempotency_error key_mismatch", err)
			}
			if n := runs.Load(); n != 1 {
				t.Errorf("upstream runs after the mismatch: got %d, want 1", n)
			}
		})
	}
}
