package webhookstorm

import (
	"bytes"
	"context"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/idemgo/idem/webhook"
)

const (
	// redeliveries is how many times each delivery is sent, at once.
	redeliveries = 5
	// resetShare is the share of the sends cut off by a connection reset
	// right after the request was written, in percent.
	resetShare = 30
	// inFlight bounds the deliveries handled at once.
	inFlight = 48
	secret   = "whsec_storm-test-secret"
)

// receiver is the webhook receiver: it checks Stripe's signature (401
// otherwise) and counts its executions per event id.
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	execs  map[string]int
	denied atomic.Int64
}

func newReceiver(t *testing.T) *receiver {
	v, err := webhook.New(webhook.Stripe, [][]byte{[]byte(secret)})
	if err != nil {
		t.Fatal(err)
	}
	src, _ := webhook.KeySource(webhook.Stripe)
	rc := &receiver{execs: make(map[string]int)}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if v.Verify(r.Header.Values, body) != nil {
			rc.denied.Add(1)
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		id, _ := src.Key(r.Header.Values, body)
		rc.mu.Lock()
		rc.execs[id]++
		rc.mu.Unlock()
		time.Sleep(time.Duration(500+mrand.IntN(2500)) * time.Microsecond) // the receiver's own work
		fmt.Fprintf(w, `{"received":%q}`, id)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

// result is what one run of the storm found.
type result struct {
	ids, executed, duplicated, lost, poisoned int
	forgedRejected, resets, sends, acked      int64
}

// storm sends n deliveries through the proxies: for each, a forged
// delivery first, then redeliveries copies at once (resetShare percent of
// them reset), then one more to read the final answer.
func storm(t *testing.T, proxies []string, rc *receiver, n int) result {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Minute)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: inFlight * redeliveries}}
	var res result
	var forged, resets, sends, acked atomic.Int64
	var mu sync.Mutex
	final := make(map[string]int)
	sem := make(chan struct{}, inFlight)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			id := "evt_storm_" + strconv.Itoa(i)
			body := fmt.Appendf(nil, `{"id":%q,"object":"event","type":"invoice.paid","data":{"object":{"amount":%d}}}`, id, i)
			real, err := webhook.Sign(webhook.Stripe, []byte(secret), id, time.Now(), body)
			if err != nil {
				t.Error(err)
				return
			}
			bad, _ := webhook.Sign(webhook.Stripe, []byte("whsec_forged"), id, time.Now(), body)
			if st := send(ctx, client, proxies[i%2], bad, body); st == http.StatusUnauthorized {
				forged.Add(1)
			}
			var dw sync.WaitGroup
			for d := range redeliveries {
				proxy := proxies[(i+d)%2]
				dw.Go(func() {
					sends.Add(1)
					if mrand.IntN(100) < resetShare {
						resets.Add(1)
						resetAfterSend(proxy, real, body)
						return
					}
					if st := sendUntilFinal(ctx, client, proxy, real, body); st/100 == 2 {
						acked.Add(1)
					}
				})
			}
			dw.Wait()
			st := sendUntilFinal(ctx, client, proxies[(i+1)%2], real, body)
			mu.Lock()
			final[id] = st
			mu.Unlock()
		})
	}
	wg.Wait()
	rc.mu.Lock()
	defer rc.mu.Unlock()
	res.ids = n
	for id, st := range final {
		e := rc.execs[id]
		if e > 0 {
			res.executed++
		}
		if e > 1 {
			res.duplicated += e - 1
		}
		if e == 0 {
			res.lost++
		}
		if st/100 != 2 {
			res.poisoned++
		}
	}
	res.forgedRejected, res.resets, res.sends, res.acked = forged.Load(), resets.Load(), sends.Load(), acked.Load()
	return res
}

// send posts one delivery and returns its status (0 for a transport error).
func send(ctx context.Context, c *http.Client, proxy string, h http.Header, body []byte) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+proxy+"/hooks/stripe", bytes.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header = h.Clone()
	res, err := c.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode
}

// sendUntilFinal sends a delivery until it gets an answer other than 409,
// 503 or a transport error, as a provider retries.
func sendUntilFinal(ctx context.Context, c *http.Client, proxy string, h http.Header, body []byte) int {
	for {
		st := send(ctx, c, proxy, h, body)
		if st != 0 && st != http.StatusConflict && st != http.StatusServiceUnavailable || ctx.Err() != nil {
			return st
		}
		time.Sleep(time.Duration(2+mrand.IntN(8)) * time.Millisecond)
	}
}

// resetAfterSend writes the delivery on a fresh connection and resets it
// (RST) without reading the answer.
func resetAfterSend(proxy string, h http.Header, body []byte) {
	conn, err := net.Dial("tcp", proxy)
	if err != nil {
		return
	}
	req, _ := http.NewRequest(http.MethodPost, "http://"+proxy+"/hooks/stripe", bytes.NewReader(body))
	req.Header = h.Clone()
	req.Write(conn)
	conn.(*net.TCPConn).SetLinger(0)
	conn.Close()
}

func startProxies(t *testing.T, bin, upstream, redisAddr string, args ...string) []string {
	var addrs []string
	for range 2 {
		_, addr := chaostest.StartProxy(t, bin, append([]string{"--upstream", upstream, "--redis", "redis://" + redisAddr, "--webhook", "stripe"}, args...)...)
		addrs = append(addrs, addr)
	}
	return addrs
}

// TestWebhookStorm: with the signature checked by the proxies, executions
// equal distinct delivery ids and no key is poisoned; the negative
// control, without the check and storing 4xx, poisons keys.
func TestWebhookStorm(t *testing.T) {
	bin := chaostest.BuildIdem(t)
	n := chaostest.Size(2000, 10000)

	t.Run("checked", func(t *testing.T) {
		srv := redistest.Start(t)
		rc := newReceiver(t)
		file := filepath.Join(t.TempDir(), "secret")
		if err := os.WriteFile(file, []byte(secret+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		proxies := startProxies(t, bin, rc.srv.URL, srv.Addr(), "--webhook-secret-file", file)
		start := time.Now()
		r := storm(t, proxies, rc, n)
		c := &chaostest.Counters{}
		c.Attempted.Store(r.sends)
		c.Acknowledged.Store(r.acked)
		c.Executed.Store(int64(r.executed + r.duplicated))
		c.Effects.Store(int64(r.executed))
		c.Lost.Store(int64(r.lost))
		c.Duplicated.Store(int64(r.duplicated))
		chaostest.Report(t, "webhook storm", "make chaos RUN=TestWebhookStorm", c, map[string]string{
			"deliveries": strconv.Itoa(n), "redeliveries": strconv.Itoa(redeliveries), "resets": strconv.FormatInt(r.resets, 10),
			"forged_rejected": strconv.FormatInt(r.forgedRejected, 10), "poisoned": strconv.Itoa(r.poisoned),
			"receiver_denied": strconv.FormatInt(rc.denied.Load(), 10), "seconds": strconv.FormatFloat(time.Since(start).Seconds(), 'f', 1, 64),
		})
		if r.executed != n || r.duplicated != 0 || r.lost != 0 || r.poisoned != 0 {
			t.Errorf("executed %d of %d ids, %d duplicates, %d lost, %d poisoned: want %d, 0, 0, 0", r.executed, n, r.duplicated, r.lost, r.poisoned, n)
		}
		if r.forgedRejected != int64(n) || rc.denied.Load() != 0 {
			t.Errorf("forged deliveries: %d answered 401 by the proxies, %d reached the receiver; want %d and 0", r.forgedRejected, rc.denied.Load(), n)
		}
		if r.resets == 0 {
			t.Error("no send was reset: the storm did not test resets")
		}
	})

	t.Run("control without the check", func(t *testing.T) {
		srv := redistest.Start(t)
		rc := newReceiver(t)
		proxies := startProxies(t, bin, rc.srv.URL, srv.Addr(), "--store-policy", "default")
		m := min(n, 500)
		r := storm(t, proxies, rc, m)
		t.Logf("control: %d ids, %d executed, %d poisoned, %d forged reached the receiver", m, r.executed, r.poisoned, rc.denied.Load())
		if r.poisoned == 0 {
			t.Errorf("control: no key poisoned: the storm no longer shows what the signature check prevents")
		}
	})
}
