package consume

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgtest"
)

var (
	binOnce sync.Once
	binDir  string // removed by TestMain
	binPath string
	binErr  error
)

// idemBin builds the idem binary (cmd/idem, without the race detector)
// once for the package's tests, into a directory that outlives each test
// (chaostest.BuildIdem builds into the test's own), or returns the one
// IDEM_CHAOS_BIN names (make chaos-suite builds it once for every package).
func idemBin(t *testing.T) string {
	t.Helper()
	if bin := os.Getenv("IDEM_CHAOS_BIN"); bin != "" {
		return bin
	}
	binOnce.Do(func() {
		binDir, binErr = os.MkdirTemp("", "idem-consume-chaos-")
		if binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "idem")
		// -trimpath, as chaostest.BuildIdem: a fresh clone reuses the
		// packages another checkout compiled.
		cmd := exec.Command("go", "build", "-trimpath", "-o", binPath, ".")
		cmd.Dir = filepath.Join("..", "..", "cmd", "idem")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("building the idem binary: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// db is a schema of its own in the test database: the handler's tables
// (calls, effects, fences) and the completion table of --gate.
type db struct {
	url  string
	conn *pgx.Conn
}

func newDB(t *testing.T) *db {
	t.Helper()
	u := pgtest.Schema(t)
	conn, err := pgx.Connect(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	for _, s := range []string{pggate.Schema,
		`CREATE TABLE calls (key text NOT NULL, fence bigint NOT NULL)`,
		`CREATE TABLE effects (key text NOT NULL, fence bigint NOT NULL)`,
		`CREATE TABLE fences (key text PRIMARY KEY, fence bigint NOT NULL)`} {
		if _, err := conn.Exec(t.Context(), s); err != nil {
			t.Fatal(err)
		}
	}
	return &db{url: u, conn: conn}
}

// effects returns the effect rows per key.
func (d *db) effects(t *testing.T) map[string]int {
	t.Helper()
	rows, err := d.conn.Query(t.Context(), `SELECT key, count(*) FROM effects GROUP BY key`)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]int{}
	for rows.Next() {
		var k string
		var n int
		if err := rows.Scan(&k, &n); err != nil {
			t.Fatal(err)
		}
		m[k] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return m
}

func (d *db) count(t *testing.T, table string) int64 {
	t.Helper()
	var n int64
	if err := d.conn.QueryRow(t.Context(), `SELECT count(*) FROM `+table).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// handler is the handler process (runHandler), restartable on its address.
type handler struct {
	t    *testing.T
	addr string
	proc *chaostest.Proc
}

// startHandler starts the handler process on addr ("127.0.0.1:0": a free
// port) with the database d, the mode and the extra settings env.
func startHandler(t *testing.T, addr string, d *db, mode string, env ...string) *handler {
	t.Helper()
	p := chaostest.StartChild(t, "handler", append([]string{envAddr + "=" + addr, envDB + "=" + d.url, envMode + "=" + mode}, env...)...)
	line := p.Expect("listening ", 60*time.Second)
	return &handler{t: t, addr: strings.TrimPrefix(line, "listening "), proc: p}
}

func (h *handler) url() string { return "http://" + h.addr + "/" }

// held waits for the handler's next held call and returns its key.
func (h *handler) held() string {
	h.t.Helper()
	f := strings.Fields(h.proc.Expect("held ", 60*time.Second))
	return f[1]
}

// release lets the held calls go on and waits for n of them to answer.
func (h *handler) release(n int) {
	h.t.Helper()
	res, err := http.Get("http://" + h.addr + "/release")
	if err != nil {
		h.t.Fatal(err)
	}
	res.Body.Close()
	for range n {
		h.proc.Expect("stale ", 60*time.Second)
	}
}

// sidecar starts idem consume with args and waits until it runs.
func sidecar(t *testing.T, args ...string) *chaostest.Proc {
	t.Helper()
	p := chaostest.StartCommand(t, idemBin(t), append([]string{"consume", "--log-format", "text", "--shutdown-timeout", "1s"}, args...))
	p.ExpectStderr(`msg="idem consume started"`, 60*time.Second)
	return p
}

// waitFor polls cond until it holds, failing the test after five minutes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within 5 minutes", what)
		}
		time.Sleep(20 * time.Millisecond) // poll the broker and the database
	}
}

// stream is a Redis stream with a consumer group, on the redis-server that
// also holds the sidecars' records.
type stream struct {
	rdb        *redis.Client
	addr, name string
	group      string
	sent       int64
}

func (s *stream) from() string {
	return "redis-stream://" + s.addr + "/" + s.name + "?group=" + s.group
}

func (s *stream) send(t *testing.T, keys ...string) {
	t.Helper()
	pipe := s.rdb.Pipeline()
	for _, k := range keys {
		pipe.XAdd(t.Context(), &redis.XAddArgs{Stream: s.name, Values: []any{"key", k, "payload", `{"key":"` + k + `"}`}})
	}
	if _, err := pipe.Exec(t.Context()); err != nil {
		t.Fatal(err)
	}
	s.sent += int64(len(keys))
}

// settled reports whether the group read every entry and none is pending.
func (s *stream) settled(t *testing.T) bool {
	t.Helper()
	groups, err := s.rdb.XInfoGroups(t.Context(), s.name).Result()
	if err != nil {
		return false
	}
	info, err := s.rdb.XInfoStream(t.Context(), s.name).Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range groups {
		if g.Name == s.group {
			return g.Pending == 0 && g.LastDeliveredID == info.LastGeneratedID
		}
	}
	return false
}

// pending returns the group's entries read and not acked.
func (s *stream) pending(t *testing.T) int64 {
	t.Helper()
	p, err := s.rdb.XPending(t.Context(), s.name, s.group).Result()
	if err != nil {
		return 0
	}
	return p.Count
}

func keyNames(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%05d", i)
	}
	return keys
}

// outcome is what one run left: counted from the database, after the
// broker settled.
type outcome struct {
	keys, lost, duplicated int
	effects, calls         int64
}

func count(t *testing.T, d *db, keys []string) outcome {
	t.Helper()
	rows := d.effects(t)
	o := outcome{keys: len(keys), calls: d.count(t, "calls")}
	for _, k := range keys {
		n := rows[k]
		o.effects += int64(n)
		if n == 0 {
			o.lost++
		}
		if n > 1 {
			o.duplicated += n - 1
		}
	}
	return o
}

// report records o as the scenario's row.
func report(t *testing.T, scenario, run string, sent, acked int64, o outcome, figures map[string]string) {
	t.Helper()
	c := &chaostest.Counters{}
	c.Attempted.Store(sent)
	c.Acknowledged.Store(acked)
	c.Executed.Store(o.calls)
	c.Effects.Store(o.effects)
	c.Lost.Store(int64(o.lost))
	c.Duplicated.Store(int64(o.duplicated))
	if figures == nil {
		figures = map[string]string{}
	}
	figures["keys"] = strconv.Itoa(o.keys)
	chaostest.Report(t, scenario, "make chaos RUN="+run, c, figures)
}
