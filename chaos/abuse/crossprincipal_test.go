package abuse

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"

	"github.com/idemgo/idem/chaos/chaostest"
)

// TestCrossPrincipalReplay is scenario 8, cross-principal replay attempts,
// on the embedded store and on Redis, with --scope-header Authorization.
// Injected: for each of 1,000 keys (long: 10,000), principal A completes
// the key; principal B sends the same key, with A's body for half of the
// keys and another body for the rest; every 10th key is also sent twice
// without Authorization (no principal); then A and B retry. Asserted:
// each principal's first request executes on its own (201, not a replay,
// not a 422: each principal has its own record), each retry replays that
// principal's own response byte for byte, a request without Authorization
// gets 400 and never runs, the upstream runs exactly once per (principal,
// key), and no response ever carries another principal's
// nonce (the upstream puts a random nonce per principal in every answer):
// 0 leaks. Negative control: the same check on a proxy without
// --scope-header must see B receive A's responses for every key.
func TestCrossPrincipalReplay(t *testing.T) {
	n := chaostest.Size(1_000, 10_000)
	bin := chaostest.BuildIdem(t)
	var c chaostest.Counters
	var leaks atomic.Int64
	figures := map[string]string{"keys": strconv.Itoa(n)}
	for _, st := range stores {
		t.Run(st.name, func(t *testing.T) {
			up := newUpstream(t)
			args, _ := st.start(t, bin)
			px := startProxy(t, bin, up.srv.URL, args, "--scope-header", "Authorization")
			client := newClient(t)
			principals := []string{"Bearer alice-" + randomKey(), "Bearer bob-" + randomKey(), ""}
			nonces := make([]string, len(principals))
			for i, p := range principals {
				nonces[i] = up.nonce(p)
			}
			// send sends principal p's request and checks that its answer
			// carries p's nonce and no other's.
			send := func(p int, key, body string) (response, answer, error) {
				var hdr []string
				if principals[p] != "" {
					hdr = []string{"Authorization", principals[p]}
				}
				c.Attempted.Add(1)
				res, err := post(client, px.url("/transfers"), key, body, hdr...)
				if err != nil {
					return res, answer{}, err
				}
				if res.status/100 == 2 {
					c.Acknowledged.Add(1)
				}
				for q, nonce := range nonces {
					if q != p && bytes.Contains(res.body, []byte(nonce)) {
						leaks.Add(1)
						return res, answer{}, fmt.Errorf("principal %d got principal %d's response %q for key %s", p, q, res.body, key)
					}
				}
				var a answer
				if res.status == http.StatusCreated {
					if err := json.Unmarshal(res.body, &a); err != nil || a.Nonce != nonces[p] || a.Key != key {
						return res, a, fmt.Errorf("principal %d, key %s: answer %q is not the upstream's for this principal and key", p, key, res.body)
					}
				}
				return res, a, nil
			}
			err := parallel(n, 16, func(i int) error {
				key := fmt.Sprintf("transfer-%06d", i)
				bodyA := fmt.Sprintf(`{"from":"alice","amount":%d}`, i)
				bodyB := bodyA
				if i%2 == 1 {
					bodyB = fmt.Sprintf(`{"from":"bob","amount":%d}`, i+1)
				}
				firstA, a, err := send(0, key, bodyA)
				if err != nil {
					return err
				}
				if firstA.status != http.StatusCreated || firstA.replayed() {
					return fmt.Errorf("A, key %s: got %d replayed=%v %q, want 201 executed", key, firstA.status, firstA.replayed(), firstA.body)
				}
				firstB, b, err := send(1, key, bodyB)
				if err != nil {
					return err
				}
				if firstB.status != http.StatusCreated || firstB.replayed() || b.Exec == a.Exec {
					return fmt.Errorf("B, key %s of A: got %d replayed=%v %q, want 201 executed on its own", key, firstB.status, firstB.replayed(), firstB.body)
				}
				if i%10 == 0 {
					// Two anonymous clients with A's key: neither runs, so
					// neither can get the other's response.
					for range 2 {
						anon, _, err := send(2, key, bodyA)
						if err != nil {
							return err
						}
						if anon.status != http.StatusBadRequest || !bytes.Contains(anon.body, []byte("principal-missing")) {
							return fmt.Errorf("no principal, key %s of A: got %d replayed=%v %q, want 400 TypePrincipalMissing", key, anon.status, anon.replayed(), anon.body)
						}
					}
				}
				for p, first := range map[int]response{0: firstA, 1: firstB} {
					body := bodyA
					if p == 1 {
						body = bodyB
					}
					again, _, err := send(p, key, body)
					if err != nil {
						return err
					}
					if again.status != first.status || !again.replayed() || !bytes.Equal(again.body, first.body) {
						return fmt.Errorf("retry of principal %d, key %s: got %d replayed=%v %q, want the replay of %q", p, key, again.status, again.replayed(), again.body, first.body)
					}
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			px.alive(t)

			var lost, dup int64
			for i := range n {
				key := fmt.Sprintf("transfer-%06d", i)
				for p, principal := range principals {
					switch e := up.executions(principal, key); {
					case p == 2: // never executed: asserted below
					case e == 0:
						lost++
					case e > 1:
						dup += int64(e - 1)
					}
				}
			}
			executed := up.calls.Load()
			c.Executed.Add(executed)
			c.Effects.Add(executed)
			c.Lost.Add(lost)
			c.Duplicated.Add(dup)
			if want := int64(2 * n); executed != want || lost != 0 || dup != 0 {
				t.Errorf("upstream executions: %d (%d lost, %d duplicated), want %d: one per principal and key", executed, lost, dup, want)
			}
			figures[st.name+"_memory_after"] = px.memory(t).String()
		})
	}
	figures["leaks"] = strconv.FormatInt(leaks.Load(), 10)

	// Negative control: without --scope-header the principals share one
	// scope, so B's request with A's key and body must get A's response:
	// the check above can see a leak.
	t.Run("control without scope header", func(t *testing.T) {
		up := newUpstream(t)
		args, _ := stores[0].start(t, bin)
		px := startProxy(t, bin, up.srv.URL, args)
		client := newClient(t)
		nonceA := up.nonce("Bearer alice")
		const keys = 20
		seen := 0
		for i := range keys {
			key, body := fmt.Sprintf("control-%d", i), fmt.Sprintf(`{"amount":%d}`, i)
			if res, err := post(client, px.url("/transfers"), key, body, "Authorization", "Bearer alice"); err != nil || res.status != http.StatusCreated {
				t.Fatalf("A, key %s: %d %q %v", key, res.status, res.body, err)
			}
			res, err := post(client, px.url("/transfers"), key, body, "Authorization", "Bearer bob")
			if err != nil {
				t.Fatal(err)
			}
			if bytes.Contains(res.body, []byte(nonceA)) {
				seen++
			}
		}
		if seen != keys {
			t.Fatalf("without a scope header B got A's response for %d of %d keys, want all: the leak check cannot see a leak", seen, keys)
		}
		figures["control_leaks_without_scope_header"] = fmt.Sprintf("%d/%d", seen, keys)
	})
	chaostest.Report(t, "abuse: cross-principal replay", command("TestCrossPrincipalReplay"), &c, figures)
}
