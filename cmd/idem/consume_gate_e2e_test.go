package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestConsumeGate: the Python (psycopg2) and the Node (pg) handlers of
// docs/consume.md (testdata/handlers/gate_handler.*, included there
// verbatim, their statement pggate.ForeignInsert) behind idem consume
// --gate on a Redis stream. Each key's effect row is written once (the
// duplicate acked without a call); a key whose completion row committed
// before (k3) is acked without a call, the row's result stored; after
// the store lost k1's record, a redelivery of k1 is acked from the row
// without a call (its stored result says so) and without a second effect
// row; the message without an amount is dead-lettered.
func TestConsumeGate(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/consume.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, interpreter, file, check string }{
		{"python", "python3", "gate_handler.py", "import psycopg2"},
		{"node", "node", "gate_handler.js", "require('pg')"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join("testdata", "handlers", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(doc), string(src)) {
				t.Errorf("docs/consume.md does not hold testdata/handlers/%s as it is", tc.file)
			}
			if !strings.Contains(string(doc), "```sql\n"+pggate.ForeignInsert+"\n```") {
				t.Error("docs/consume.md does not hold pggate.ForeignInsert as it is")
			}
			stmt := pggate.ForeignInsert
			if tc.name == "python" {
				for _, n := range []string{"$1", "$2", "$3", "$4"} {
					stmt = strings.Replace(stmt, n, "%s", 1)
				}
			}
			if !strings.Contains(string(src), stmt) {
				t.Errorf("testdata/handlers/%s does not hold pggate.ForeignInsert", tc.file)
			}
			env := os.Environ()
			if tc.name == "node" {
				env = withNodePath(env)
			}
			// The interpreter on PATH, or Debian's, where python3-psycopg2
			// installs (a python3 of pyenv's may come first on PATH).
			bin, why := "", ""
			for _, c := range []string{tc.interpreter, "/usr/bin/" + tc.interpreter} {
				path, err := exec.LookPath(c)
				if err != nil {
					why = err.Error()
					continue
				}
				probe := exec.Command(path, "-c", tc.check)
				if tc.name == "node" {
					probe = exec.Command(path, "-e", tc.check)
				}
				probe.Env = env
				if out, err := probe.CombinedOutput(); err != nil {
					why = fmt.Sprintf("%s: %s: %v %s", path, tc.check, err, out)
					continue
				}
				bin = path
				break
			}
			if bin == "" {
				t.Skipf("%s (.ci/run installs python3-psycopg2 and pg)", why)
			}

			gateURL := pgtest.Schema(t)
			u, _ := url.Parse(gateURL)
			schema := u.Query().Get("search_path")
			ctx := t.Context()
			conn, err := pgx.Connect(ctx, gateURL)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close(context.Background()) })
			if _, err := conn.Exec(ctx, pggate.Schema); err != nil {
				t.Fatal(err)
			}
			if _, err := conn.Exec(ctx, `CREATE TABLE payments (key text NOT NULL, amount int NOT NULL)`); err != nil {
				t.Fatal(err)
			}
			// k3's effect committed before (its record then lost).
			k3 := idem.Key{Scope: "payments", ID: "k3"}.Digest()
			if _, err := conn.Exec(ctx, pggate.ForeignInsert, k3, int64(1), []byte(`{"charged":30}`), 3600); err != nil {
				t.Fatal(err)
			}

			addr := freeAddr(t)
			_, port, _ := net.SplitHostPort(addr)
			base, _ := url.Parse(gateURL)
			q := base.Query()
			q.Del("search_path")
			base.RawQuery = q.Encode()
			cmd := exec.Command(bin, filepath.Join("testdata", "handlers", tc.file), port, base.String())
			cmd.Env = append(env, "PGOPTIONS=-c search_path="+schema)
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
			waitFor(t, "the handler listening", func() bool {
				c, err := net.Dial("tcp", addr)
				if err == nil {
					c.Close()
				}
				return err == nil
			})

			srv := redistest.Start(t)
			rdb := srv.GoRedis(t)
			for _, e := range [][2]string{{"k1", `{"amount":10}`}, {"k1", `{"amount":10}`}, {"bad", `{}`}, {"k2", `{"amount":20}`}, {"k3", `{"amount":30}`}} {
				xadd(t, rdb, "payments", "key", e[0], "payload", e[1])
			}
			p := startIdem(t, "consume", "--from", "redis-stream://"+srv.Addr()+"/payments?group=ledger", "--to", "http://"+addr+"/",
				"--gate", gateURL, "--retry-delay", "10ms", "--lease", "1s")
			settled := func(dead int64) func() bool {
				return func() bool {
					dl, _ := rdb.XLen(t.Context(), "payments:dlq").Result()
					return dl == dead && pendingCount(t, rdb, "payments", "ledger") == 0 && lastDelivered(t, rdb, "payments", "ledger")
				}
			}
			waitFor(t, "every entry settled", settled(1))
			// The store loses k1's record; k1 comes again.
			if err := rdb.Del(ctx, "idem:{"+idem.Key{Scope: "payments", ID: "k1"}.Digest()+"}").Err(); err != nil {
				t.Fatal(err)
			}
			xadd(t, rdb, "payments", "key", "k1", "payload", `{"amount":10}`)
			waitFor(t, "k1's redelivery settled", settled(1))
			p.terminate()
			if code := p.wait(); code != 0 {
				t.Errorf("exit code: %d, want 0", code)
			}

			rows := map[string]int{}
			r, err := conn.Query(ctx, `SELECT key, count(*) FROM payments GROUP BY key`)
			if err != nil {
				t.Fatal(err)
			}
			for r.Next() {
				var k string
				var n int
				r.Scan(&k, &n)
				rows[k] = n
			}
			if len(rows) != 2 || rows["k1"] != 1 || rows["k2"] != 1 {
				t.Errorf("effect rows per key: got %v, want k1 and k2 once, k3 none", rows)
			}
			if v := storedResult(t, rdb, "payments", "k3"); !v.Gate || string(v.Body) != `{"charged":30}` {
				t.Errorf("k3's stored result: got %+v, want the committed row's result, not called (Gate)", v)
			}
			if v := storedResult(t, rdb, "payments", "k1"); !v.Gate {
				t.Errorf("k1's stored result after the store lost its record: got %+v, want the row's, not called (Gate)", v)
			}
			if v := storedResult(t, rdb, "payments", "k2"); v.Gate || v.Status != 200 || !strings.Contains(string(v.Body), "20") {
				t.Errorf("k2's stored result: got %+v, want the handler's 200", v)
			}
		})
	}
}
