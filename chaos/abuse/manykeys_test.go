package abuse

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/idemgo/idem/chaos/chaostest"
)

// TestManyKeysOnePrincipal is scenario 8, 10^5 distinct keys from one
// principal (short: 10^4), on the embedded store and on Redis, with
// --scope-header Authorization and every request carrying the same
// Authorization. Injected: each key sent once by 32 concurrent workers,
// then every 10th key again. Asserted: every first request executes
// (201, exactly one upstream execution per key), every repeat is a replay
// of its original, the store holds exactly one record per key (Redis
// DBSIZE; the embedded store through `idem ls` after a clean shutdown), and
// the proxy's anonymous memory (RssAnon: the heap, not the embedded store's
// memory-mapped file) stays under 64 MiB, so that 10^5 keys kept in the
// proxy at 1 KiB each would fail the long variant: the records live in the
// store.
func TestManyKeysOnePrincipal(t *testing.T) {
	const anonBound = 64 << 20
	n := chaostest.Size(10_000, 100_000)
	bin := chaostest.BuildIdem(t)
	var c chaostest.Counters
	figures := map[string]string{"keys": strconv.Itoa(n)}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			up := newUpstream(t)
			args, count := st.start(t, bin)
			px := startProxy(t, bin, up.srv.URL, args, "--scope-header", "Authorization")
			client := newClient(t)
			const principal = "Bearer one-principal"
			keys := make([]string, n)
			for i := range keys {
				keys[i] = fmt.Sprintf("k-%07d-%s", i, randomKey())
			}
			before := px.memory(t)
			first := make([][]byte, n)
			start := time.Now()
			err := parallel(n, 32, func(i int) error {
				c.Attempted.Add(1)
				res, err := post(client, px.url("/orders"), keys[i], `{"item":`+strconv.Itoa(i)+`}`, "Authorization", principal)
				if err != nil {
					return fmt.Errorf("key %d: %v", i, err)
				}
				if res.status != http.StatusCreated || res.replayed() {
					return fmt.Errorf("key %d: got %d replayed=%v %q, want 201 executed", i, res.status, res.replayed(), res.body)
				}
				c.Acknowledged.Add(1)
				first[i] = res.body
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			err = parallel(n/10, 32, func(j int) error {
				i := j * 10
				c.Attempted.Add(1)
				res, err := post(client, px.url("/orders"), keys[i], `{"item":`+strconv.Itoa(i)+`}`, "Authorization", principal)
				if err != nil {
					return fmt.Errorf("repeat of key %d: %v", i, err)
				}
				if res.status != http.StatusCreated || !res.replayed() || string(res.body) != string(first[i]) {
					return fmt.Errorf("repeat of key %d: got %d replayed=%v %q, want the replay of %q", i, res.status, res.replayed(), res.body, first[i])
				}
				c.Acknowledged.Add(1)
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			after := px.memory(t)
			px.alive(t)

			var executed, dup, lost int64
			for i, k := range keys {
				switch e := up.executions(principal, k); {
				case e == 0:
					lost++
				case e > 1:
					dup += int64(e - 1)
				}
				var a answer
				if err := json.Unmarshal(first[i], &a); err != nil || a.Key != k {
					t.Fatalf("key %d: response %q is not the upstream's answer for it", i, first[i])
				}
			}
			executed = up.calls.Load()
			c.Executed.Add(executed)
			c.Effects.Add(executed)
			c.Lost.Add(lost)
			c.Duplicated.Add(dup)
			if executed != int64(n) || lost != 0 || dup != 0 {
				t.Errorf("upstream executions: %d for %d keys (%d lost, %d duplicated), want exactly one per key", executed, n, lost, dup)
			}

			if st.name == "embedded" {
				px.stop(t) // the store file is locked while the proxy runs
			}
			if got := count(t); got != n {
				t.Errorf("the store holds %d records, want %d", got, n)
			}
			if after.anon > anonBound>>10 {
				t.Errorf("proxy anonymous memory %s after %d keys (%s before), want under %s", mib(after.anon), n, before, mib(anonBound>>10))
			}
			figures[st.name+"_rss_before"] = before.String()
			figures[st.name+"_rss_after"] = after.String()
			figures[st.name+"_req_per_s"] = fmt.Sprintf("%.0f", float64(n)/took.Seconds())
			figures[st.name+"_records"] = strconv.Itoa(n)
		})
	}
	chaostest.Report(t, "abuse: 10^5 keys one principal", command("TestManyKeysOnePrincipal"), &c, figures)
}
