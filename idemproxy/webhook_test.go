package idemproxy

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/webhook"
)

// receiver is a webhook receiver that checks signatures itself, as a
// receiver must: 401 for a bad one, 200 and one execution otherwise.
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	execs  map[string]int // per delivery id
	denied int
}

func newReceiver(t *testing.T, provider string, secret []byte) *receiver {
	t.Helper()
	v, err := webhook.New(provider, [][]byte{secret})
	if err != nil {
		t.Fatal(err)
	}
	src, _ := webhook.KeySource(provider)
	rc := &receiver{execs: make(map[string]int)}
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
		fmt.Fprintf(w, "processed %s (%d)", id, rc.execs[id])
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) count(id string) (execs, denied int) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.execs[id], rc.denied
}

// delivery returns a signed delivery of provider with id (forged: signed
// with another secret).
func delivery(t *testing.T, provider string, secret []byte, id string) (http.Header, []byte) {
	t.Helper()
	body := fmt.Appendf(nil, `{"id":%q,"type":"test.event","data":{"n":1}}`, id)
	h, err := webhook.Sign(provider, secret, id, time.Now(), body)
	if err != nil {
		t.Fatal(err)
	}
	return h, body
}

func testSecret(provider string, forged bool) []byte {
	s := "test-secret"
	if forged {
		s = "forged-secret"
	}
	if provider == webhook.StandardWebhooks {
		return []byte("whsec_" + base64Std(s))
	}
	return []byte(s)
}

func post(t *testing.T, url string, h http.Header, body []byte) response {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), "POST", url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header = h.Clone()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return response{status: res.StatusCode, header: res.Header, body: string(b)}
}

// TestWebhookForgedFirst: for every provider, a forged delivery that
// carries a real delivery's id and arrives first gets 401 from the proxy
// and leaves no record; the real delivery then runs once, and its
// redelivery is replayed. The negative control, the same proxy without
// the Verifier and with the default policy, stores the receiver's 401
// and replays it to the real delivery, which is never processed.
func TestWebhookForgedFirst(t *testing.T) {
	for _, provider := range webhook.Providers {
		t.Run(provider, func(t *testing.T) {
			secret := testSecret(provider, false)
			rc := newReceiver(t, provider, secret)
			target, _ := url.Parse(rc.srv.URL)
			v, err := webhook.New(provider, [][]byte{secret})
			if err != nil {
				t.Fatal(err)
			}
			src, _ := webhook.KeySource(provider)
			exec := newExecutor(t)
			u := serve(t, &Proxy{Target: target, Executor: exec, KeySource: src, Verifier: v}) + "/hooks"

			id := "dlv-" + provider
			realH, realBody := delivery(t, provider, secret, id)
			forgedH, forgedBody := delivery(t, provider, testSecret(provider, true), id)
			res := post(t, u, forgedH, forgedBody)
			if res.status != http.StatusUnauthorized || !bytes.Contains([]byte(res.body), []byte("signature-invalid")) {
				t.Fatalf("forged: got %d %q, want 401 signature-invalid", res.status, res.body)
			}
			key := idemhttp.PathKey("POST", "/hooks", id)
			if _, err := adapterkit.Store(exec).Get(t.Context(), key.Digest()); err != storekit.ErrNotFound {
				t.Fatalf("the forged delivery's key: got %v, want no record", err)
			}
			if n, denied := rc.count(id); n != 0 || denied != 0 {
				t.Fatalf("receiver: %d executions, %d denied, want none: the proxy must stop a forged delivery", n, denied)
			}
			first := post(t, u, realH, realBody)
			again := post(t, u, realH, realBody)
			if first.status != 200 || again.status != 200 || !again.replayed() || again.body != first.body {
				t.Errorf("real delivery: got %d %q, then %d %q replayed=%v", first.status, first.body, again.status, again.body, again.replayed())
			}
			if n, _ := rc.count(id); n != 1 {
				t.Errorf("executions of %s: got %d, want 1", id, n)
			}

			// Negative control: no Verifier, the policy that stores 4xx.
			rc2 := newReceiver(t, provider, secret)
			target2, _ := url.Parse(rc2.srv.URL)
			u2 := serve(t, &Proxy{Target: target2, Executor: newExecutor(t), KeySource: src}) + "/hooks"
			post(t, u2, forgedH, forgedBody)
			poisoned := post(t, u2, realH, realBody)
			if n, _ := rc2.count(id); n != 0 || poisoned.status != http.StatusUnauthorized || !poisoned.replayed() {
				t.Errorf("control: got %d replayed=%v and %d executions, want the forged 401 replayed and none: the control no longer shows the poisoning", poisoned.status, poisoned.replayed(), n)
			}
		})
	}
}

// TestWebhookRedeliveryStorm: for every provider, 20 redeliveries of each
// of several deliveries, sent at once from several senders, a third of
// them cut off by a connection reset right after the request was sent:
// one execution per delivery id, and every delivery then gets its
// response.
func TestWebhookRedeliveryStorm(t *testing.T) {
	for _, provider := range webhook.Providers {
		t.Run(provider, func(t *testing.T) {
			secret := testSecret(provider, false)
			rc := newReceiver(t, provider, secret)
			target, _ := url.Parse(rc.srv.URL)
			v, _ := webhook.New(provider, [][]byte{secret})
			src, _ := webhook.KeySource(provider)
			exec := newExecutor(t)
			base := serve(t, &Proxy{Target: target, Executor: exec, KeySource: src, Verifier: v, Wait: adapterkit.Lease(exec)})
			addr := base[len("http://"):]
			const deliveries, redeliveries = 5, 20
			var wg sync.WaitGroup
			for d := range deliveries {
				id := fmt.Sprintf("storm-%s-%d", provider, d)
				h, body := delivery(t, provider, secret, id)
				for i := range redeliveries {
					wg.Go(func() {
						if i%3 == 0 {
							resetAfterSend(t, addr, h, body)
							return
						}
						if res := post(t, base+"/hooks", h, body); res.status != 200 {
							t.Errorf("%s redelivery %d: got %d %q", id, i, res.status, res.body)
						}
					})
				}
			}
			wg.Wait()
			for d := range deliveries {
				id := fmt.Sprintf("storm-%s-%d", provider, d)
				h, body := delivery(t, provider, secret, id)
				if res := post(t, base+"/hooks", h, body); res.status != 200 {
					t.Errorf("%s after the storm: got %d %q", id, res.status, res.body)
				}
				if n, _ := rc.count(id); n != 1 {
					t.Errorf("executions of %s: got %d, want 1", id, n)
				}
			}
		})
	}
}

// resetAfterSend writes a request on a fresh connection and resets the
// connection (RST) without reading the answer.
func resetAfterSend(t *testing.T, addr string, h http.Header, body []byte) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Error(err)
		return
	}
	req, _ := http.NewRequest("POST", "http://"+addr+"/hooks", bytes.NewReader(body))
	req.Header = h.Clone()
	if err := req.Write(conn); err != nil {
		t.Error(err)
	}
	conn.(*net.TCPConn).SetLinger(0)
	conn.Close()
}

func base64Std(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }
