package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"
)

// The -callgrind mode counts the instructions redis-server executes per new
// key, under valgrind's callgrind, for idem's acquire and complete and for
// the floor's two plain writes. Instruction counts do not depend on how
// busy the machine is, where the Redis time per call (INFO commandstats)
// does, so this mode compares the two where wall-clock ratios cannot.
//
// Each row runs on one connection, one call at a time, over fresh keys:
//
//   - floor: SET key p NX GET PX 60000, then SET key <50-byte value> PX
//     86400000, as internal/httpbench/floor.go (no Lua, no record), on keys
//     outside the store's prefix, so that they cost no invalidation
//     message of the stores' replay caches (client tracking), which the
//     stores' rows pay as they do in production;
//   - go-redis, rueidis: Executor.Do on a new key (acquire.lua, then
//     complete.lua with its PUBLISH), as in the lifecycle rows;
//   - lua-floor: the floor's two SETs, each sent as a script that makes
//     that one call and returns its reply (EVALSHA), on keys outside the
//     prefix: the least any design whose transitions run in Lua makes
//     Redis do per new key (the Lua call's entry and exit, KEYS and ARGV
//     turned into Lua values, redis.call, the reply turned back), so its
//     ratio to the floor is the lowest a script-based store can reach;
//   - replay: Executor.Do on one completed key through go-redis with no
//     local replay cache (WithReplayCache(false)), so that every replay is
//     an acquire.lua call: a replay the cache does not hold. Its ratio to
//     the floor is not shown; it is there to show what a change to
//     acquire.lua costs replays.
//
// Before each row the database is emptied and warmupKeys keys warm the
// connection and the script cache; then the counters are zeroed
// (callgrind_control -z), -keys keys run, and the counters are dumped
// (callgrind_control -d); -profiles DIR keeps each row's last dump there
// as <row>.callgrind. Two figures per key: "server", every instruction
// of the process in that window (reading the requests, running them,
// writing the replies, and the idle event loop, which is a few hundred
// instructions per key at most); and "command", the instructions inside
// processCommand (looking the command up and running it: what INFO
// commandstats times, plus the lookup). Every figure is the median of
// -runs interleaved runs. A second table counts single steps of the
// scripts and of their alternatives (TIME, cmsgpack against struct, …),
// each in a loop inside one EVAL.

// warmupKeys is how many new keys each row runs before its counters are
// zeroed.
const warmupKeys = 200

// callgrindRows are the rows of the -callgrind mode, in the order they run
// and print; the first is the base of the ratios.
var callgrindRows = []string{"floor", "lua-floor", "go-redis", "rueidis", "replay"}

// The scripts of the lua-floor row: the floor's two writes, each from Lua.
var (
	luaFloorClaim    = redis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'GET', 'PX', ARGV[2])`)
	luaFloorComplete = redis.NewScript(`return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])`)
)

// cgServer is a redis-server running under callgrind.
type cgServer struct {
	*server
	out string // callgrind's output file; each dump adds a suffix .N
}

func runCallgrind(ctx context.Context, o options, keys int, profiles string) error {
	for _, bin := range []string{"valgrind", "callgrind_control", "callgrind_annotate", "redis-server"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%s not found on PATH (apt-get install -y valgrind redis-server): %w", bin, err)
		}
	}
	dir, err := os.MkdirTemp("", "idem-callgrind-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	out := filepath.Join(dir, "callgrind.out")
	progress("starting redis-server under callgrind")
	srv, err := startServer(ctx, "valgrind", "--tool=callgrind", "--callgrind-out-file="+out)
	if err != nil {
		return err
	}
	defer srv.remove()
	defer srv.stop()
	s := &cgServer{server: srv, out: out}

	addr := srv.addr()
	// The script steps run for seconds under valgrind.
	ad := admin{redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1, ReadTimeout: 5 * time.Minute})}
	defer ad.c.Close()
	// The server's timer (serverCron) runs hz times a second of wall time,
	// which valgrind and a busy machine stretch: at 1 it adds a few
	// hundred instructions per key instead of thousands.
	if err := ad.c.ConfigSet(ctx, "hz", "1").Err(); err != nil {
		return err
	}
	gr := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 1})
	defer gr.Close()
	ru, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{addr}, DisableCache: true})
	if err != nil {
		return fmt.Errorf("rueidis: %w", err)
	}
	defer ru.Close()
	// Each row opens its store and closes it when it ends, so that only
	// its own replay cache's tracking connection (go-redis) is open while
	// it runs, as in a process with one store.
	openStore := func(row string) (*redisstore.Store, error) {
		switch row {
		case "go-redis":
			return redisstore.New(gr)
		case "rueidis":
			return redisstore.NewRueidis(ru)
		case "replay":
			return redisstore.New(gr, redisstore.WithReplayCache(false))
		}
		return nil, nil
	}
	newKey := func(row string, run, i int) idem.Key {
		return idem.Key{Scope: "bench", ID: row + "-" + strconv.Itoa(run) + "-" + strconv.Itoa(i)}
	}
	op := func(row string, e *idem.Executor) func(ctx context.Context, k idem.Key) error {
		if row == "floor" {
			return func(ctx context.Context, k idem.Key) error {
				key := "floor:{" + k.Digest() + "}"
				if err := gr.SetArgs(ctx, key, "p", redis.SetArgs{Mode: "NX", Get: true, TTL: time.Minute}).Err(); !errors.Is(err, redis.Nil) {
					return fmt.Errorf("claim of a new key: got %v, want redis.Nil", err)
				}
				return gr.Set(ctx, key, value, retention).Err()
			}
		}
		if row == "lua-floor" {
			return func(ctx context.Context, k idem.Key) error {
				key := "luafloor:{" + k.Digest() + "}"
				if err := luaFloorClaim.Run(ctx, gr, []string{key}, "p", time.Minute.Milliseconds()).Err(); !errors.Is(err, redis.Nil) {
					return fmt.Errorf("claim of a new key: got %v, want redis.Nil", err)
				}
				return luaFloorComplete.Run(ctx, gr, []string{key}, value, retention.Milliseconds()).Err()
			}
		}
		if row == "replay" {
			return func(ctx context.Context, _ idem.Key) error {
				r, err := e.Do(ctx, replayKey, "fp", fn)
				if err == nil && !r.Replayed {
					err = errors.New("the completed key was not replayed")
				}
				return err
			}
		}
		return func(ctx context.Context, k idem.Key) error {
			r, err := e.Do(ctx, k, "fp", fn)
			if err == nil && r.Replayed {
				err = errors.New("a new key was replayed")
			}
			return err
		}
	}

	load0 := loadAverage()
	samples := map[string][]float64{}
	for r := range o.runs {
		for _, row := range callgrindRows {
			progress("run %d/%d: %s, %d keys", r+1, o.runs, row, keys)
			if err := ad.flush(ctx); err != nil {
				return err
			}
			st, err := openStore(row)
			if err != nil {
				return err
			}
			var e *idem.Executor
			if st != nil {
				if e, err = newExecutor(st); err != nil {
					return err
				}
			}
			do := op(row, e)
			if row == "replay" { // the record every call replays
				if _, err := e.Do(ctx, replayKey, "fp", fn); err != nil {
					return fmt.Errorf("%s: %w", row, err)
				}
			}
			for i := range warmupKeys {
				if err := do(ctx, newKey(row+"-warm", r, i)); err != nil {
					return fmt.Errorf("%s: %w", row, err)
				}
			}
			if err := s.control(ctx, "-z"); err != nil {
				return err
			}
			for i := range keys {
				if err := do(ctx, newKey(row, r, i)); err != nil {
					return fmt.Errorf("%s: %w", row, err)
				}
			}
			keep := ""
			if profiles != "" {
				keep = filepath.Join(profiles, row+".callgrind")
			}
			total, command, err := s.dump(ctx, keep)
			if st != nil {
				st.Close()
			}
			if err != nil {
				return err
			}
			samples[row+"/server"] = append(samples[row+"/server"], float64(total)/float64(keys))
			samples[row+"/command"] = append(samples[row+"/command"], float64(command)/float64(keys))
		}
	}
	progress("script steps")
	steps, err := s.scriptSteps(ctx, ad)
	if err != nil {
		return err
	}
	writeCallgrind(os.Stdout, samples, keys, o.runs, load0, loadAverage())
	writeSteps(os.Stdout, steps)
	return nil
}

// stepLoop is how many times scriptSteps runs each step, in one EVAL.
const stepLoop = 20000

// scriptStepPrelude sets up the values the steps use: a record in
// acquire.lua's format and the same fields packed with Redis's struct
// library (fixed-size integers, then lengths and strings).
const scriptStepPrelude = `
local fp, owner, res = 'f0e1d2c3b4a5968778695a4b3c2d1e0f', 'owner-0123456789abcdef', string.rep('x', 51)
local rec = cmsgpack.pack(1, 'p', fp, owner, 1764000000000000, 1764000010000000, 1, 1764000000000000, '')
local srec = struct.pack('>Bc1I8I8I4I8Bc0Bc0', 2, 'p', 1764000000000000, 1764000010000000, 1, 1764000000000000, #fp, fp, #owner, owner)
local res50 = string.rep('x', 50)
local x
`

// scriptSteps are single steps of the transitions and of their
// alternatives, each measured as stepLoop iterations of a loop in one EVAL,
// less the empty loop.
var scriptSteps = []struct{ name, body string }{
	{"loop", `x = i`},
	{"TIME and its two tonumber", `local t = redis.call('TIME') x = tonumber(t[1]) * 1000000 + tonumber(t[2])`},
	{"GET of an absent key", `x = redis.call('GET', 'absent')`},
	{"PUBLISH, no subscriber", `redis.call('PUBLISH', 'idem:{x}:w', 'c')`},
	// A batch script's two writes per message (its Lua call's entry and
	// exit shared by the batch): SET … NX GET PX of a new key, then SET …
	// PX of that key with a 50-byte value; the key name's own cost (the
	// third step) is to be taken off both.
	{"SET NX GET PX of a new key", `redis.call('SET', 'step:' .. i, 'p', 'NX', 'GET', 'PX', 60000)`},
	{"SET PX of an existing key (50 bytes)", `redis.call('SET', 'step:' .. i, res50, 'PX', 86400000)`},
	{"the key name 'step:' .. i", `x = 'step:' .. i`},
	{"table {1, fence, 1}", `x = {1, i, 1}`},
	{"cmsgpack.pack, new record", `x = cmsgpack.pack(1, 'p', fp, owner, i, i, 1, i, '')`},
	{"struct.pack, new record", `x = struct.pack('>Bc1I8I8I4I8Bc0Bc0', 2, 'p', i, i, 1, i, #fp, fp, #owner, owner)`},
	{"cmsgpack.pack, completed (51-byte result)", `x = cmsgpack.pack(1, 'c', fp, '', i, 0, 1, i, res)`},
	{"struct.pack, completed (51-byte result)", `x = struct.pack('>Bc1I8I8I4I8Bc0Bc0', 2, 'c', i, 0, 1, i, #fp, fp, 0, '') .. res`},
	{"cmsgpack.unpack", `local ver, s, f, o, n, l, a, c, r = cmsgpack.unpack(rec)`},
	{"struct.unpack", `local ver, s, n, l, a, c, f, o, pos = struct.unpack('>Bc1I8I8I4I8Bc0Bc0', srec)`},
}

// scriptSteps returns the instructions per step of the package's
// scriptSteps (the
// loop's own, for "loop").
func (s *cgServer) scriptSteps(ctx context.Context, ad admin) ([]float64, error) {
	out := make([]float64, len(scriptSteps))
	for i, st := range scriptSteps {
		if err := s.control(ctx, "-z"); err != nil {
			return nil, err
		}
		if err := ad.c.Eval(ctx, scriptStepPrelude+"for i = 1, "+strconv.Itoa(stepLoop)+" do\n"+st.body+"\nend\nreturn 1", nil).Err(); err != nil {
			return nil, fmt.Errorf("step %s: %w", st.name, err)
		}
		total, _, err := s.dump(ctx, "")
		if err != nil {
			return nil, err
		}
		out[i] = float64(total) / stepLoop
		if i > 0 {
			out[i] -= out[0]
		}
	}
	return out, nil
}

func writeSteps(w io.Writer, steps []float64) {
	fmt.Fprintf(w, "\nInstructions per step inside a script (%d iterations in one EVAL, less the empty loop's)\n\n", stepLoop)
	fmt.Fprintln(w, "| step | instructions |")
	fmt.Fprintln(w, "|---|---:|")
	for i, st := range scriptSteps {
		fmt.Fprintf(w, "| %s | %.0f |\n", st.name, steps[i])
	}
}

// control runs callgrind_control with flag on the server's process; it
// returns once valgrind has done it.
func (s *cgServer) control(ctx context.Context, flag string) error {
	out, err := exec.CommandContext(ctx, "callgrind_control", flag, strconv.Itoa(s.cmd.Process.Pid)).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "OK") {
		return fmt.Errorf("callgrind_control %s: %v: %s", flag, err, out)
	}
	return nil
}

// dumpTotals matches the totals line of a callgrind dump.
var dumpTotals = regexp.MustCompile(`(?m)^totals: (\d+)`)

// processCommandLine matches processCommand's inclusive count in
// callgrind_annotate --inclusive=yes.
var processCommandLine = regexp.MustCompile(`(?m)^\s*([\d,]+) .*:processCommand \[`)

// dump dumps the counters since the last zeroing and returns the
// instructions of the whole process and those inside processCommand. If
// keep is not empty, the dump is moved there (for callgrind_annotate or
// kcachegrind), else removed.
func (s *cgServer) dump(ctx context.Context, keep string) (total, command int64, err error) {
	before, _ := filepath.Glob(s.out + ".*")
	if err := s.control(ctx, "-d"); err != nil {
		return 0, 0, err
	}
	after, _ := filepath.Glob(s.out + ".*")
	var file string
	for _, f := range after {
		if !slices.Contains(before, f) {
			file = f
		}
	}
	if file == "" {
		return 0, 0, errors.New("callgrind_control -d wrote no dump")
	}
	if keep != "" {
		if err := os.Rename(file, keep); err != nil {
			return 0, 0, err
		}
		file = keep
	} else {
		defer os.Remove(file)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return 0, 0, err
	}
	m := dumpTotals.FindSubmatch(data)
	if m == nil {
		return 0, 0, fmt.Errorf("%s: no totals line", file)
	}
	total, _ = strconv.ParseInt(string(m[1]), 10, 64)
	ann, err := exec.CommandContext(ctx, "callgrind_annotate", "--inclusive=yes", "--threshold=100", file).Output()
	if err != nil {
		return 0, 0, fmt.Errorf("callgrind_annotate: %w", err)
	}
	m = processCommandLine.FindSubmatch(ann)
	if m == nil {
		return 0, 0, errors.New("callgrind_annotate: no processCommand line (a redis-server without symbols?)")
	}
	command, _ = strconv.ParseInt(strings.ReplaceAll(string(m[1]), ",", ""), 10, 64)
	return total, command, nil
}

func writeCallgrind(w io.Writer, samples map[string][]float64, keys, runs int, load0, load1 string) {
	fmt.Fprintf(w, "Redis instructions per new key (replay row: per replay) (callgrind), %d keys per row, median of %d runs; load average %s → %s\n\n", keys, runs, load0, load1)
	fmt.Fprintln(w, "| row | server instr/key | / floor | command instr/key | / floor | runs (server) |")
	ratio := func(row string, v float64, base string) string {
		if row == "replay" {
			return "–"
		}
		return strconv.FormatFloat(v/median(samples[base]), 'f', 2, 64)
	}
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	base := callgrindRows[0]
	for _, row := range callgrindRows {
		sv, cm := median(samples[row+"/server"]), median(samples[row+"/command"])
		var runs []string
		for _, v := range samples[row+"/server"] {
			runs = append(runs, strconv.FormatFloat(v, 'f', 0, 64))
		}
		fmt.Fprintf(w, "| %s | %.0f | %s | %.0f | %s | %s |\n", row, sv, ratio(row, sv, base+"/server"),
			cm, ratio(row, cm, base+"/command"), strings.Join(runs, ", "))
	}
}
