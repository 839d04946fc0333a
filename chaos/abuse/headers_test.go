package abuse

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/idemhttp"
)

// TestHugeHeaders is scenario 8, huge headers and malformed keys, on the
// embedded store and on Redis. Injected, each on its own connection: a
// 1 MiB header field, a 1 MiB + 8 KiB one, 10,000 header fields of 120
// bytes (1.2 MB in all),
// 10,000 small header fields (130 KB in all, under net/http's 1 MiB limit),
// a 100 KiB Idempotency-Key, and malformed keys (empty, an unterminated or
// empty sf-string, sf-string parameters, a tab inside quotes, non-ASCII,
// 256 characters, a control character). Asserted: header sections over
// net/http's limit (1 MiB plus 4 KiB of slack) get 431 before the proxy
// reads them; the 1 MiB field and the 10,000 small fields, within it, are
// ordinary requests that execute once; every bad key gets 400 with a
// message naming the problem (problem+json from the proxy, or net/http's
// own 400 for a control character, which it refuses before any handler
// runs) and none of them reaches the upstream; the proxy serves a normal
// request afterwards.
func TestHugeHeaders(t *testing.T) {
	bin := chaostest.BuildIdem(t)
	var c chaostest.Counters
	figures := map[string]string{}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			up := newUpstream(t)
			args, _ := st.start(t, bin)
			px := startProxy(t, bin, up.srv.URL, args)
			send := func(key string, fields ...string) response {
				t.Helper()
				head := "POST /payments HTTP/1.1\r\nHost: proxy\r\nContent-Length: 2"
				if key != "\x00none" {
					head += "\r\nIdempotency-Key: " + key
				}
				for _, f := range fields {
					head += "\r\n" + f
				}
				c.Attempted.Add(1)
				res, _, err := raw(px.addr, head, strings.NewReader("{}"))
				if err != nil {
					t.Fatalf("request with a %d-byte key and %d fields: %v", len(key), len(fields), err)
				}
				if res.status/100 == 2 {
					c.Acknowledged.Add(1)
				}
				return res
			}

			// A 1 MiB field is within net/http's limit (MaxHeaderBytes,
			// 1 MiB, plus 4 KiB of slack): an ordinary request.
			mibField := send("k-1mib-field", "X-Big: "+strings.Repeat("a", 1<<20))
			if mibField.status != http.StatusCreated {
				t.Errorf("a 1 MiB field: got %d %q, want 201 (within net/http's header limit)", mibField.status, mibField.body)
			}
			figures[st.name+"_1MiB_field"] = fmt.Sprint(mibField.status)

			// Oversized header sections: 431 from net/http.
			big := send("k-big-field", "X-Big: "+strings.Repeat("a", 1<<20+8<<10))
			many := make([]string, 10_000)
			for i := range many {
				many[i] = fmt.Sprintf("X-H-%05d: %s", i, strings.Repeat("v", 108))
			}
			manyBig := send("k-many-big", many...)
			for name, res := range map[string]response{"a 1 MiB + 8 KiB field": big, "10,000 fields of 120 bytes": manyBig} {
				if res.status != http.StatusRequestHeaderFieldsTooLarge {
					t.Errorf("%s: got %d %q, want 431", name, res.status, res.body)
				}
			}
			figures[st.name+"_1MiB+8KiB_field"] = fmt.Sprint(big.status)
			figures[st.name+"_10000_fields_1.2MB"] = fmt.Sprint(manyBig.status)

			// 10,000 small fields: within the limit, an ordinary request.
			for i := range many {
				many[i] = fmt.Sprintf("X-H-%05d: v", i)
			}
			small := send("k-many-small", many...)
			if small.status != http.StatusCreated || small.replayed() {
				t.Errorf("10,000 small fields: got %d %q, want 201 (executed)", small.status, small.body)
			}
			figures[st.name+"_10000_fields_130KB"] = fmt.Sprint(small.status)
			calls := up.calls.Load()

			// Bad keys: 400 with a message, never forwarded.
			for _, tc := range []struct{ name, key, want string }{
				{"100 KiB key", strings.Repeat("k", 100<<10), "over the limit"},
				{"256 characters", strings.Repeat("k", 256), "over the limit"},
				{"empty", "", "empty"},
				{"empty sf-string", `""`, "empty"},
				{"unterminated sf-string", `"abc`, ""},
				{"sf-string parameters", `"abc";p=1`, ""},
				{"tab in an sf-string", "\"a\tb\"", ""},
				{"non-ASCII", "caf\xc3\xa9", ""},
				{"control character", "a\x01b", "400 Bad Request"},
			} {
				res := send(tc.key)
				detail := string(res.body)
				switch {
				case res.status != http.StatusBadRequest:
					t.Errorf("%s: got %d %q, want 400", tc.name, res.status, detail)
				case tc.name == "control character":
					// net/http refuses the request itself, in plain text.
				case !res.problem() || !bytes.Contains(res.body, []byte(idemhttp.TypeKeyInvalid)) && !bytes.Contains(res.body, []byte(idemhttp.TypeKeyMissing)):
					t.Errorf("%s: got %q %q, want a problem+json of type %s", tc.name, res.header.Get("Content-Type"), detail, idemhttp.TypeKeyInvalid)
				}
				if !strings.Contains(detail, tc.want) {
					t.Errorf("%s: message %q does not say %q", tc.name, detail, tc.want)
				}
				figures[st.name+"_key_"+strings.ReplaceAll(tc.name, " ", "_")] = fmt.Sprint(res.status)
			}
			if n := up.calls.Load(); n != calls {
				t.Errorf("%d requests with bad keys reached the upstream", n-calls)
			}

			// Alive and serving.
			px.alive(t)
			c.Attempted.Add(1)
			res, err := post(newClient(t), px.url("/payments"), "after-the-abuse", "{}")
			if err != nil || res.status != http.StatusCreated {
				t.Fatalf("a normal request after the abuse: %d %q %v, want 201", res.status, res.body, err)
			}
			c.Acknowledged.Add(1)
			executed := up.calls.Load()
			c.Executed.Add(executed)
			c.Effects.Add(executed)
			if executed != 3 {
				t.Errorf("the upstream ran %d times, want 3 (the 1 MiB field, the 10,000 small fields and the normal request)", executed)
			}
			figures[st.name+"_memory_after"] = px.memory(t).String()
		})
	}
	chaostest.Report(t, "abuse: huge headers", command("TestHugeHeaders"), &c, figures)
}
