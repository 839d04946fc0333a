package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/idemgo/idem/testkit/redistest"
)

// TestConsumeHandlers: the Python and the Node handlers of docs/consume.md
// (testdata/handlers, included there verbatim; one Node handler on Express
// from npm), one request per message
// (--to) and one per batch (--to-batch), behind idem consume on a Redis
// stream: each key's effect is written once (the duplicate acked without
// a call), the message without an amount is dead-lettered.
func TestConsumeHandlers(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/consume.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, interpreter, file, flag, module string }{
		{"python", "python3", "handler.py", "--to", ""},
		{"node", "node", "handler.js", "--to", ""},
		{"node-express", "node", "express_handler.js", "--to", "express"},
		{"python-batch", "python3", "batch_handler.py", "--to-batch", ""},
		{"node-batch", "node", "batch_handler.js", "--to-batch", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src, err := os.ReadFile(filepath.Join("testdata", "handlers", tc.file))
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(doc), string(src)) {
				t.Errorf("docs/consume.md does not hold testdata/handlers/%s as it is", tc.file)
			}
			bin, err := exec.LookPath(tc.interpreter)
			if err != nil {
				t.Skipf("%s is not installed (.ci/run installs it): %v", tc.interpreter, err)
			}
			env := os.Environ()
			if tc.module != "" { // an npm package, installed globally (.ci/run)
				env = withNodePath(env)
				probe := exec.Command(bin, "-e", "require('"+tc.module+"')")
				probe.Env = env
				if out, err := probe.CombinedOutput(); err != nil {
					t.Skipf("%s: require('%s'): %v %s (.ci/run installs it)", bin, tc.module, err, out)
				}
			}
			addr := freeAddr(t)
			_, port, _ := net.SplitHostPort(addr)
			effects := filepath.Join(t.TempDir(), "effects")
			cmd := exec.Command(bin, filepath.Join("testdata", "handlers", tc.file), port, effects)
			cmd.Env = env
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
			for _, e := range [][2]string{{"k1", `{"amount":10}`}, {"k1", `{"amount":10}`}, {"bad", `{}`}, {"k2", `{"amount":20}`}} {
				xadd(t, rdb, "payments", "key", e[0], "payload", e[1])
			}
			p := startIdem(t, "consume", "--from", "redis-stream://"+srv.Addr()+"/payments?group=ledger", tc.flag, "http://"+addr+"/")
			waitFor(t, "every entry settled", func() bool {
				dl, _ := rdb.XLen(t.Context(), "payments:dlq").Result()
				return dl == 1 && pendingCount(t, rdb, "payments", "ledger") == 0 && lastDelivered(t, rdb, "payments", "ledger")
			})
			p.terminate()
			if code := p.wait(); code != 0 {
				t.Errorf("exit code: %d, want 0", code)
			}
			got, _ := os.ReadFile(effects)
			lines := strings.Split(strings.TrimSpace(string(got)), "\n")
			slices.Sort(lines)
			if want := []string{"k1 10", "k2 20"}; !slices.Equal(lines, want) {
				t.Errorf("effects: got %q, want %q (one per key)", lines, want)
			}
			if v := storedResult(t, rdb, "payments", "k2"); v.Status != 200 || !strings.Contains(string(v.Body), "20") {
				t.Errorf("k2's stored result: %+v, want the handler's 200", v)
			}
		})
	}
}

// withNodePath returns env with NODE_PATH set to npm's global modules
// (`npm root -g`), where .ci/run installs the handlers' npm packages; env
// as it is when npm is not there.
func withNodePath(env []string) []string {
	root, err := exec.Command("npm", "root", "-g").Output()
	if err != nil {
		return env
	}
	return append(env, "NODE_PATH="+strings.TrimSpace(string(root)))
}
