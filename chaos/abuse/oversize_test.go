package abuse

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/idemhttp"
)

const (
	maxBody     = 1 << 20  // --max-body
	maxResponse = 64 << 10 // --max-response
	hugeBody    = 1 << 30  // the body streamed at the proxy
)

// TestOversizedBodies is scenario 8, oversized bodies, on the embedded
// store and on Redis. Injected: a POST with a declared 1 GiB body and a
// chunked 1 GiB body streamed from a generator (--max-body 1MiB), a body
// one byte over the limit, and an upstream response of twice
// --max-response. Asserted: every oversized request gets 413
// (problem+json) and never reaches the upstream; the proxy answers while
// the body is still being sent, having accepted at most a few MiB of it, and
// its peak RSS (VmHWM) stays below 1/8 of the body size; a body exactly at
// the limit executes; the oversized response is delivered once in full,
// the key is FAILED and the retry gets 422 without a second execution.
func TestOversizedBodies(t *testing.T) {
	bin := chaostest.BuildIdem(t)
	var c chaostest.Counters
	figures := map[string]string{}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			up := newUpstream(t)
			args, _ := st.start(t, bin)
			px := startProxy(t, bin, up.srv.URL, args, "--max-body", "1MiB", "--max-response", "64KiB")
			client := newClient(t)
			before := px.memory(t)

			// A 1 GiB body, declared and chunked.
			for _, tc := range []struct {
				name string
				head string
				body func() *chunked
			}{
				{"declared", "Content-Length: " + fmt.Sprint(hugeBody), nil},
				{"chunked", "Transfer-Encoding: chunked", func() *chunked { return &chunked{r: &zeros{left: hugeBody}} }},
			} {
				key := "huge-" + tc.name
				head := "POST /payments HTTP/1.1\r\nHost: proxy\r\nIdempotency-Key: " + key + "\r\n" + tc.head
				var body *zeros
				var res response
				var written int64
				var err error
				start := time.Now()
				c.Attempted.Add(1)
				if tc.body != nil {
					res, written, err = raw(px.addr, head, tc.body())
				} else {
					body = &zeros{left: hugeBody}
					res, written, err = raw(px.addr, head, body)
				}
				took := time.Since(start)
				if err != nil {
					t.Fatalf("%s 1 GiB body: %v", tc.name, err)
				}
				if res.status != http.StatusRequestEntityTooLarge || !res.problem() || !bytes.Contains(res.body, []byte(idemhttp.TypeBodyTooLarge)) {
					t.Fatalf("%s 1 GiB body: got %d %q, want 413 %s", tc.name, res.status, res.body, idemhttp.TypeBodyTooLarge)
				}
				if written >= hugeBody/8 {
					t.Errorf("%s 1 GiB body: the proxy took %d bytes before it answered 413", tc.name, written)
				}
				if n := up.executions("", key); n != 0 {
					t.Errorf("%s 1 GiB body reached the upstream %d times", tc.name, n)
				}
				figures[st.name+"_413_"+tc.name] = fmt.Sprintf("%v after %s sent", took.Round(time.Millisecond), mib(written>>10))
			}

			// One byte over the limit, and exactly at it.
			c.Attempted.Add(2)
			over, err := post(client, px.url("/payments"), "over-by-one", strings.Repeat("x", maxBody+1))
			if err != nil || over.status != http.StatusRequestEntityTooLarge {
				t.Fatalf("a body of max-body+1 bytes: %d %q %v, want 413", over.status, over.body, err)
			}
			at, err := post(client, px.url("/payments"), "at-limit", strings.Repeat("x", maxBody))
			if err != nil || at.status != http.StatusCreated {
				t.Fatalf("a body of exactly max-body bytes: %d %q %v, want 201", at.status, at.body, err)
			}
			c.Acknowledged.Add(1)
			if n := up.executions("", "over-by-one"); n != 0 {
				t.Errorf("a body over the limit reached the upstream %d times", n)
			}

			// A response over --max-response: sent once, then 422.
			c.Attempted.Add(2)
			first, err := post(client, px.url(fmt.Sprintf("/big?n=%d", 2*maxResponse)), "big-response", "")
			if err != nil || first.status != http.StatusOK || len(first.body) != 2*maxResponse || first.replayed() {
				t.Fatalf("oversized response: %d, %d bytes, replayed=%v, %v; want 200 with %d bytes", first.status, len(first.body), first.replayed(), err, 2*maxResponse)
			}
			c.Acknowledged.Add(1)
			retry, err := post(client, px.url(fmt.Sprintf("/big?n=%d", 2*maxResponse)), "big-response", "")
			if err != nil || retry.status != http.StatusUnprocessableEntity || !bytes.Contains(retry.body, []byte(idemhttp.TypeKeyFailed)) {
				t.Fatalf("retry of an oversized response: %d %q %v; want 422 %s", retry.status, retry.body, err, idemhttp.TypeKeyFailed)
			}
			if n := up.executions("", "big-response"); n != 1 {
				t.Errorf("the oversized response's key ran %d times, want 1", n)
			}

			px.alive(t)
			after := px.memory(t)
			if after.hwm > hugeBody/8>>10 {
				t.Errorf("proxy peak RSS %s after 1 GiB bodies, want below %s", mib(after.hwm), mib(hugeBody/8>>10))
			}
			figures[st.name+"_rss_before"] = before.String()
			figures[st.name+"_rss_after"] = after.String()
			calls := up.calls.Load()
			c.Executed.Add(calls)
			c.Effects.Add(calls)
			if calls != 2 {
				c.Duplicated.Add(max(calls-2, 0))
				t.Errorf("the upstream ran %d times, want 2 (the body at the limit and the oversized response)", calls)
			}
		})
	}
	chaostest.Report(t, "abuse: oversized bodies", command("TestOversizedBodies"), &c, figures)
}
