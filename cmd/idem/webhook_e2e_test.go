package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/testkit/redistest"
	"github.com/idemgo/idem/webhook"
)

// webhookReceiver checks signatures itself, as a receiver must: 401 for a
// bad one, 200 and one execution per delivery id otherwise.
type webhookReceiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	execs  map[string]int
	denied int
}

func newWebhookReceiver(t *testing.T, provider string, secret []byte) *webhookReceiver {
	t.Helper()
	v, err := webhook.New(provider, [][]byte{secret})
	if err != nil {
		t.Fatal(err)
	}
	src, _ := webhook.KeySource(provider)
	rc := &webhookReceiver{execs: make(map[string]int)}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if v.Verify(r.Header.Values, body) != nil {
			rc.denied++
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		id, _ := src.Key(r.Header.Values, body)
		rc.execs[id]++
		fmt.Fprintf(w, "processed %s", id)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *webhookReceiver) executions(id string) int {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.execs[id]
}

func sendSigned(t *testing.T, url, provider string, secret []byte, id string) response {
	t.Helper()
	body := fmt.Appendf(nil, `{"id":%q,"object":"event","type":"invoice.paid"}`, id)
	h, err := webhook.Sign(provider, secret, id, time.Now(), body)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequestWithContext(t.Context(), "POST", url, bytes.NewReader(body))
	req.Header = h
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := readAll(res)
	return response{status: res.StatusCode, header: res.Header, body: string(b)}
}

// TestProxyWebhook runs `idem proxy --webhook` on Redis for GitHub (the
// secret in a file) and Stripe (the secret in IDEM_WEBHOOK_SECRET, the
// key in the body): a forged delivery that carries a real delivery's id
// and arrives first gets 401 and writes nothing to Redis; the real
// delivery then runs once and its redelivery is replayed; the secret
// appears nowhere in what the proxy prints. Without a secret the proxy
// warns and stores only 2xx, so the forged 401 releases the key.
func TestProxyWebhook(t *testing.T) {
	t.Parallel()
	for _, provider := range []string{webhook.GitHub, webhook.Stripe} {
		t.Run(provider, func(t *testing.T) {
			t.Parallel()
			secret := []byte("s3cret-" + provider + "-value")
			rc := newWebhookReceiver(t, provider, secret)
			srv := redistest.Start(t)
			rdb := srv.GoRedis(t)
			addr, admin := freeAddr(t), freeAddr(t)
			args := []string{"proxy", "--listen", addr, "--admin-listen", admin, "--upstream", rc.srv.URL, "--redis", "redis://" + srv.Addr(), "--webhook", provider}
			var env []string
			if provider == webhook.GitHub {
				file := filepath.Join(t.TempDir(), "secret")
				if err := os.WriteFile(file, append([]byte("old-secret\n"), secret...), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--webhook-secret-file", file)
			} else {
				env = []string{"IDEM_WEBHOOK_SECRET=" + string(secret)}
			}
			p := launchProxyEnv(t, env, args, addr, admin)
			url := p.url("/hooks/" + provider)
			id := "dlv-" + provider

			if res := sendSigned(t, url, provider, []byte("forged"), id); res.status != 401 || !strings.Contains(res.body, "signature-invalid") {
				t.Fatalf("forged: got %d %q, want 401 signature-invalid", res.status, res.body)
			}
			if n, err := rdb.DBSize(t.Context()).Result(); err != nil || n != 0 {
				t.Fatalf("keys in Redis after the forged delivery: got %d, %v, want 0", n, err)
			}
			first := sendSigned(t, url, provider, secret, id)
			again := sendSigned(t, url, provider, secret, id)
			if first.status != 200 || again.status != 200 || !again.replayed() {
				t.Errorf("real delivery: got %d then %d replayed=%v", first.status, again.status, again.replayed())
			}
			if n := rc.executions(id); n != 1 {
				t.Errorf("executions: got %d, want 1", n)
			}
			p.terminate()
			if strings.Contains(p.stderr.String(), string(secret)) {
				t.Errorf("the proxy printed the secret:\n%s", p.stderr.String())
			}
		})
	}

	t.Run("no secret", func(t *testing.T) {
		t.Parallel()
		secret := []byte("receiver-secret")
		rc := newWebhookReceiver(t, webhook.Shopify, secret)
		p := startProxy(t, rc.srv.URL, []string{"--data", t.TempDir()}, "--webhook", webhook.Shopify)
		url := p.url("/hooks")
		if res := sendSigned(t, url, webhook.Shopify, []byte("forged"), "d-1"); res.status != 401 {
			t.Fatalf("forged: got %d, want the receiver's 401", res.status)
		}
		if res := sendSigned(t, url, webhook.Shopify, secret, "d-1"); res.status != 200 || res.replayed() {
			t.Errorf("real delivery after a forged one: got %d replayed=%v, want it processed: only 2xx are stored without a secret", res.status, res.replayed())
		}
		if n := rc.executions("d-1"); n != 1 {
			t.Errorf("executions: got %d, want 1", n)
		}
		if !strings.Contains(p.stderr.String(), "signatures are not checked") {
			t.Errorf("no warning about unchecked signatures:\n%s", p.stderr.String())
		}
	})

	t.Run("bad flags", func(t *testing.T) {
		t.Parallel()
		for _, tt := range []struct {
			args []string
			want string
		}{
			{[]string{"--webhook", "gitlab"}, `invalid --webhook "gitlab"`},
			{[]string{"--webhook-secret-file", "x"}, "needs --webhook"},
			{[]string{"--webhook", "github", "--webhook-secret-file", filepath.Join(t.TempDir(), "none")}, "--webhook-secret-file"},
		} {
			code, _, stderr := runIdem(t, append([]string{"proxy", "--upstream", "http://127.0.0.1:1", "--check-upstream=false", "--data", t.TempDir()}, tt.args...)...)
			if code != 2 || !strings.Contains(stderr, tt.want) {
				t.Errorf("%q: got exit %d %q, want 2 and %q", tt.args, code, stderr, tt.want)
			}
		}
	})
}
