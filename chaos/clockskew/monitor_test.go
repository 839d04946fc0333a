package clockskew

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/observe"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// command is one command a client sent, as MONITOR shows it.
type command struct {
	client string // "127.0.0.1:port"
	args   []string
}

func (c command) String() string { return fmt.Sprintf("%s %q", c.client, c.args) }

// monitor is a MONITOR connection to a redis-server.
type monitor struct {
	conn net.Conn
	r    *bufio.Reader
}

// monitorEnd is the ECHO argument that marks the end of a recording.
const monitorEnd = "clockskew: end of the recording"

func startMonitor(t *testing.T, addr string) *monitor {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	m := &monitor{conn: conn, r: bufio.NewReaderSize(conn, 1<<16)}
	if _, err := conn.Write([]byte("*1\r\n$7\r\nMONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	if line := m.line(t); line != "+OK" {
		t.Fatalf("MONITOR replied %q", line)
	}
	return m
}

func (m *monitor) line(t *testing.T) string {
	t.Helper()
	if err := m.conn.SetReadDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	line, err := m.r.ReadString('\n')
	if err != nil {
		t.Fatalf("MONITOR: %v", err)
	}
	return strings.TrimSuffix(line, "\r\n")
}

// collect sends the end marker on another connection and returns the
// commands that clients sent until then. Commands that scripts ran inside
// the server (shown as from "lua") are the server's own and are left out.
func (m *monitor) collect(t *testing.T, srv *redistest.Server) []command {
	t.Helper()
	if _, err := srv.Command("ECHO", monitorEnd); err != nil {
		t.Fatal(err)
	}
	var cmds []command
	for {
		line := m.line(t)
		c, err := parseMonitorLine(line)
		if err != nil {
			t.Fatalf("MONITOR line %q: %v", line, err)
		}
		if len(c.args) == 2 && strings.EqualFold(c.args[0], "ECHO") && c.args[1] == monitorEnd {
			return cmds
		}
		if c.client != "lua" {
			cmds = append(cmds, c)
		}
	}
}

// parseMonitorLine parses `+<time> [<db> <client>] "arg" "arg" ...`, whose
// arguments are quoted with the escapes of Redis's sdscatrepr (\\, \", \n,
// \r, \t, \a, \b, \xHH), which Go's strconv.Unquote reads.
func parseMonitorLine(line string) (command, error) {
	open := strings.IndexByte(line, '[')
	closing := strings.IndexByte(line, ']')
	if !strings.HasPrefix(line, "+") || open < 0 || closing < open {
		return command{}, errors.New("not a MONITOR line")
	}
	_, client, _ := strings.Cut(line[open+1:closing], " ")
	var c command
	c.client = client
	rest := line[closing+1:]
	for {
		rest = strings.TrimLeft(rest, " ")
		if rest == "" {
			return c, nil
		}
		if rest[0] != '"' {
			return command{}, fmt.Errorf("argument does not start with a quote: %q", rest)
		}
		end := 1
		for end < len(rest) && rest[end] != '"' {
			if rest[end] == '\\' {
				end++
			}
			end++
		}
		if end >= len(rest) {
			return command{}, errors.New("unterminated argument")
		}
		arg, err := strconv.Unquote(rest[:end+1])
		if err != nil {
			return command{}, fmt.Errorf("argument %s: %w", rest[:end+1], err)
		}
		c.args = append(c.args, arg)
		rest = rest[end+1:]
	}
}

// Bounds of a plausible timestamp, 2000-01-01 to 2100-01-01, in seconds.
const (
	year2000 = 946684800
	year2100 = 4102444800
)

var dateLike = regexp.MustCompile(`(19|20|21)\d\d-[01]\d-[0-3]\d`)

// timestampLike reports whether arg reads as a point in time: an integer or
// decimal number of seconds, milliseconds, microseconds or nanoseconds
// since the epoch between 2000 and 2100, or a date.
func timestampLike(arg string) bool {
	if dateLike.MatchString(arg) {
		return true
	}
	whole, _, _ := strings.Cut(arg, ".")
	n, err := strconv.ParseInt(whole, 10, 64)
	if err != nil {
		return false
	}
	for _, unit := range []int64{1, 1e3, 1e6, 1e9} {
		if n >= year2000*unit && n <= year2100*unit {
			return true
		}
	}
	return false
}

// scan returns the arguments of cmds that read as timestamps and are not
// one of the fences the server handed out, and the number of arguments
// that were fences.
func scan(cmds []command, fences map[int64]bool) (flagged []string, fenceArgs int) {
	for _, c := range cmds {
		for i, a := range c.args {
			if !timestampLike(a) {
				continue
			}
			if n, err := strconv.ParseInt(a, 10, 64); err == nil && fences[n] {
				fenceArgs++
				continue
			}
			flagged = append(flagged, fmt.Sprintf("argument %d of %s", i, c))
		}
	}
	return flagged, fenceArgs
}

// fenceSet collects the fences the server handed out.
type fenceSet struct {
	mu sync.Mutex
	m  map[int64]bool
}

func (f *fenceSet) add(n int64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m == nil {
		f.m = make(map[int64]bool)
	}
	f.m[n] = true
}

// redisCommands is the MONITOR half of the scenario; see the package doc.
func redisCommands(t *testing.T, c *chaostest.Counters, figures map[string]string) {
	srv := redistest.Start(t)
	gr := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	grStore := chaostest.GoRedisStore(t, gr)
	ruStore, ru := chaostest.RueidisStore(t, rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})

	// Negative control: a client timestamp sent through each client is
	// flagged by the scan, so the scan can see one.
	mon := startMonitor(t, srv.Addr())
	now := time.Now()
	if err := gr.Set(t.Context(), "control:ms", now.UnixMilli(), 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := ru.Do(t.Context(), ru.B().Set().Key("control:µs").Value(strconv.FormatInt(now.UnixMicro(), 10)).Build()).Error(); err != nil {
		t.Fatal(err)
	}
	if err := gr.Set(t.Context(), "control:date", now.Format(time.RFC3339), 0).Err(); err != nil {
		t.Fatal(err)
	}
	control, _ := scan(mon.collect(t, srv), nil)
	if len(control) != 3 {
		t.Fatalf("negative control: the scan flagged %d client timestamps, want 3: %q", len(control), control)
	}

	var fences fenceSet
	lifecycle(t, grStore, "go-redis", &fences, c)
	lifecycle(t, ruStore, "rueidis", &fences, c)
	cmds := mon.collect(t, srv)

	args := 0
	scripts := 0
	for _, cmd := range cmds {
		args += len(cmd.args)
		if len(cmd.args) > 0 && strings.HasPrefix(strings.ToUpper(cmd.args[0]), "EVAL") {
			scripts++
		}
	}
	flagged, fenceArgs := scan(cmds, fences.m)
	for _, f := range flagged {
		t.Errorf("a client timestamp reached Redis: %s", f)
	}
	if scripts < 20 {
		t.Errorf("MONITOR saw %d script calls, want the whole lifecycle (at least 20)", scripts)
	}
	if fenceArgs == 0 {
		t.Error("no fence argument seen: the scan did not see the owners' calls")
	}
	figures["redis_commands_scanned"] = strconv.Itoa(len(cmds))
	figures["redis_script_calls"] = strconv.Itoa(scripts)
	figures["redis_args_scanned"] = strconv.Itoa(args)
	figures["redis_fence_args"] = strconv.Itoa(fenceArgs)
	figures["client_timestamps_sent"] = strconv.Itoa(len(flagged))
	figures["negative_control"] = "3 of 3 client timestamps flagged"
}

// lifecycle runs every transition of the state machine through store.
func lifecycle(t *testing.T, store *redisstore.Store, scope string, fences *fenceSet, c *chaostest.Counters) {
	t.Helper()
	ctx := t.Context()
	key := func(id string) idem.Key { return idem.Key{Scope: "clockskew/" + scope, ID: id} }
	const leaseD = 600 * time.Millisecond
	exec, err := idem.New(store, idem.WithLease(leaseD), idem.WithRetention(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	do := func(id, fp string, fn func(context.Context) ([]byte, error)) (idem.Result, error) {
		c.Attempted.Add(1)
		res, err := exec.Do(ctx, key(id), fp, func(ctx context.Context) ([]byte, error) {
			c.Executed.Add(1)
			f, _ := idem.FenceFrom(ctx)
			fences.add(f)
			if fn == nil {
				t.Errorf("%s: key %s executed, want no execution", scope, id)
				return nil, nil
			}
			return fn(ctx)
		})
		if err == nil {
			c.Acknowledged.Add(1)
		}
		return res, err
	}

	// Acquire, a heartbeat extension, an in-progress answer, complete.
	if _, err := do("heartbeat", "fp", func(ctx context.Context) ([]byte, error) {
		digest := key("heartbeat").Digest()
		first := get(t, store, digest)
		waitRecord(t, store, digest, "a heartbeat extension", func(r storekit.Record) bool { return r.LeaseUntil.After(first.LeaseUntil) })
		if _, _, err := exec.Begin(ctx, key("heartbeat"), "fp"); !errors.Is(err, idem.ErrInProgress) {
			t.Errorf("%s: Begin while held: got %v, want ErrInProgress", scope, err)
		}
		return []byte("v"), nil
	}); err != nil {
		t.Fatalf("%s: Do: %v", scope, err)
	}
	// Replay, and a mismatch.
	if res, err := do("heartbeat", "fp", nil); err != nil || !res.Replayed {
		t.Fatalf("%s: second Do: %+v, %v, want a replay", scope, res, err)
	}
	if _, err := do("heartbeat", "other", nil); !errors.Is(err, idem.ErrMismatch) {
		t.Fatalf("%s: Do with another fingerprint: %v, want ErrMismatch", scope, err)
	}
	// A retryable failure releases; the next call runs again.
	if _, err := do("retry", "fp", func(context.Context) ([]byte, error) { return nil, errors.New("try later") }); err == nil {
		t.Fatalf("%s: a failing Do succeeded", scope)
	}
	if _, err := do("retry", "fp", func(context.Context) ([]byte, error) { return []byte("v"), nil }); err != nil {
		t.Fatalf("%s: Do after a retryable failure: %v", scope, err)
	}
	// A terminal failure is stored and replayed.
	if _, err := do("terminal", "fp", func(context.Context) ([]byte, error) { return nil, idem.Terminal(errors.New("card declined")) }); err == nil {
		t.Fatalf("%s: a terminal failure succeeded", scope)
	}
	if _, err := do("terminal", "fp", nil); !errors.Is(err, idem.ErrFailed) {
		t.Fatalf("%s: Do after a terminal failure: %v, want ErrFailed", scope, err)
	}
	// Release.
	_, a, err := exec.Begin(ctx, key("release"), "fp")
	if err != nil {
		t.Fatal(err)
	}
	fences.add(a.Lease().Fence)
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Takeover after the lease, and the stale owner's complete refused.
	short, err := idem.New(store, idem.WithLease(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	_, stale, err := short.Begin(ctx, key("takeover"), "fp")
	if err != nil {
		t.Fatal(err)
	}
	fences.add(stale.Lease().Fence)
	if err := stale.Abandon(t.Context(), observe.Abandoned); err != nil {
		t.Fatal(err)
	}
	waitRecord(t, store, stale.Key(), "the end of the lease", func(r storekit.Record) bool { return r.Now.After(r.LeaseUntil) })
	_, owner, err := short.Begin(ctx, key("takeover"), "fp")
	if err != nil {
		t.Fatal(err)
	}
	fences.add(owner.Lease().Fence)
	if _, ok := owner.TakenOver(); !ok {
		t.Fatalf("%s: Begin after the lease: not a takeover", scope)
	}
	if err := store.Complete(ctx, stale.Key(), stale.Lease(), []byte("stale"), time.Hour); !errors.Is(err, idem.ErrLeaseLost) {
		t.Fatalf("%s: the stale owner's complete: %v, want ErrLeaseLost", scope, err)
	}
	if err := owner.Commit(ctx, []byte("v")); err != nil {
		t.Fatal(err)
	}
	// A batch, and Await woken by the completion's notification.
	keys := []idem.Key{key("batch-1"), key("batch-2")}
	began := adapterkit.BeginBatch(ctx, exec, keys, []string{"fp", "fp"})
	var attempts []*idem.Attempt
	for _, b := range began {
		if b.Err != nil {
			t.Fatal(b.Err)
		}
		fences.add(b.Attempt.Lease().Fence)
		attempts = append(attempts, b.Attempt)
	}
	awaited := make(chan error, 1)
	go func() { awaited <- exec.Await(ctx, keys[0]) }()
	for _, err := range adapterkit.CommitBatch(ctx, exec, attempts, [][]byte{[]byte("1"), []byte("2")}) {
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := <-awaited; err != nil {
		t.Fatalf("%s: Await: %v", scope, err)
	}
}

func get(t *testing.T, s idem.Store, digest string) storekit.Record {
	t.Helper()
	r, err := s.Get(t.Context(), digest)
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	return r
}

// waitRecord polls the store until the key's record satisfies cond. Every
// time it compares is the store's own (Record.Now, LeaseUntil).
func waitRecord(t *testing.T, s idem.Store, digest, what string, cond func(storekit.Record) bool) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for {
		r, err := s.Get(t.Context(), digest)
		if err == nil && cond(r) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s within %v: last record %+v, %v", what, waitLimit, r, err)
		}
		time.Sleep(5 * time.Millisecond) // poll the store's record
	}
}
