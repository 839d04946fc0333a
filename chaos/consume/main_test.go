package consume

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/chaos/chaostest"
	sidecarapi "github.com/idemgo/idem/consumer/sidecar"
	"github.com/idemgo/idem/postgres/pggate"
)

func TestMain(m *testing.M) {
	if role := chaostest.Role(); role != "" {
		if role != "handler" {
			fmt.Fprintln(os.Stderr, "unknown role", role)
			os.Exit(2)
		}
		os.Exit(runHandler())
	}
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// The handler process's settings, from its environment (see startHandler).
const (
	envAddr   = "CONSUME_HANDLER_ADDR"    // where it listens ("127.0.0.1:0": a free port)
	envDB     = "CONSUME_HANDLER_DB"      // its database (the effects, the fences, the completion rows)
	envMode   = "CONSUME_HANDLER_MODE"    // gate, fence or none (see runHandler)
	envHold   = "CONSUME_HANDLER_HOLD"    // keys whose first call in this process is held
	envHoldAt = "CONSUME_HANDLER_HOLD_AT" // before (the effect), after (it committed, before the answer) or late (after, until /release)
	envFail   = "CONSUME_HANDLER_FAIL"    // keys whose first call in this process answers 503
)

// runHandler is the handler process behind idem consume: a separate
// process (the test binary run as the role "handler") that the scenarios
// kill. Every call is recorded in calls; its effect is a row in effects,
// written in one transaction with, by mode:
//
//   - gate: the key's completion row (pggate.ForeignInsert with the
//     Idempotency-Digest, -Fence and Idem-Retention headers; no row
//     changed: another delivery committed, roll back and answer 409);
//   - fence: the fence check of docs/consume.md: the key's fence in
//     fences, raised only by a larger fence; not raised, roll back, and
//     if the stored fence is the call's own (the same call again after
//     its answer was lost) answer 200, the effect written already, or if
//     it is above (a newer owner wrote) answer 409;
//   - none: nothing (the negative control).
//
// The first call of a key in CONSUME_HANDLER_HOLD writes "held KEY FENCE"
// on stdout and waits: before its effect until GET /release (and then
// writes "stale KEY STATUS"), after its effect committed, forever (the
// process is killed), or (late) after its effect committed until GET
// /release, past the sidecar's --handler-timeout. POST /batch serves
// --to-batch: each message of the request as such a call, in order.
func runHandler() int {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(envDB))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	mode, holdAt := os.Getenv(envMode), os.Getenv(envHoldAt)
	hold, fail := setOf(os.Getenv(envHold)), setOf(os.Getenv(envFail))
	var seen sync.Map // key -> first call seen in this process
	release := make(chan struct{})
	var releaseOnce sync.Once
	var stdout sync.Mutex
	say := func(format string, args ...any) {
		stdout.Lock()
		defer stdout.Unlock()
		chaostest.Say(format, args...)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /release", func(w http.ResponseWriter, r *http.Request) {
		releaseOnce.Do(func() { close(release) })
	})
	// call handles one message and returns its answer's status.
	call := func(ctx context.Context, key, digest string, fence, retention int64) int {
		if _, err := pool.Exec(ctx, `INSERT INTO calls (key, fence) VALUES ($1, $2)`, key, fence); err != nil {
			return http.StatusInternalServerError
		}
		_, again := seen.LoadOrStore(key, true)
		held := hold[key] && !again
		if fail[key] && !again {
			return http.StatusServiceUnavailable // retried: the broker delivers it again
		}
		if held && holdAt == "before" {
			say("held %s %d", key, fence)
			<-release
		}
		status := apply(ctx, pool, mode, key, digest, fence, retention)
		if held && holdAt == "after" {
			say("held %s %d", key, fence)
			select {} // killed with its answer unsent
		}
		if held && holdAt == "late" {
			say("held %s %d", key, fence)
			<-release
		}
		if held {
			say("stale %s %d", key, status)
		}
		return status
	}
	mux.HandleFunc("POST /", func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		fence, _ := strconv.ParseInt(r.Header.Get("Idempotency-Fence"), 10, 64)
		retention, _ := strconv.ParseInt(r.Header.Get("Idem-Retention"), 10, 64)
		// The handler does not watch its client: a call goes on after
		// the sidecar that made it is gone.
		w.WriteHeader(call(context.WithoutCancel(r.Context()), r.Header.Get("Idempotency-Key"), r.Header.Get("Idempotency-Digest"), fence, retention))
	})
	// POST /batch is the same handler for idem consume --to-batch: the
	// messages of a request one after the other, each as a call of its own.
	mux.HandleFunc("POST /batch", func(w http.ResponseWriter, r *http.Request) {
		var msgs []sidecarapi.BatchMessage
		if err := json.NewDecoder(r.Body).Decode(&msgs); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		ctx := context.WithoutCancel(r.Context())
		out := make([]sidecarapi.BatchOutcome, len(msgs))
		for k, m := range msgs {
			retention, _ := strconv.ParseInt(m.Headers["Idem-Retention"], 10, 64)
			out[k].Status = call(ctx, m.Key, m.Headers["Idempotency-Digest"], m.Fence, retention)
		}
		json.NewEncoder(w).Encode(out)
	})
	ln, err := net.Listen("tcp", os.Getenv(envAddr))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	say("listening %s", ln.Addr())
	fmt.Fprintln(os.Stderr, http.Serve(ln, mux))
	return 1
}

// apply writes key's effect as mode says and returns the answer.
func apply(ctx context.Context, pool *pgxpool.Pool, mode, key, digest string, fence, retention int64) int {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return http.StatusInternalServerError
	}
	defer tx.Rollback(ctx)
	switch mode {
	case "gate":
		tag, err := tx.Exec(ctx, pggate.ForeignInsert, digest, fence, []byte(`{"done":true}`), retention)
		if err != nil {
			return http.StatusInternalServerError
		}
		if tag.RowsAffected() == 0 {
			return http.StatusConflict // another delivery committed: acked from its row
		}
	case "fence":
		tag, err := tx.Exec(ctx, `INSERT INTO fences AS f (key, fence) VALUES ($1, $2)
			ON CONFLICT (key) DO UPDATE SET fence = excluded.fence WHERE f.fence < excluded.fence`, key, fence)
		if err != nil {
			return http.StatusInternalServerError
		}
		if tag.RowsAffected() == 0 {
			var stored int64
			if err := tx.QueryRow(ctx, `SELECT fence FROM fences WHERE key = $1`, key).Scan(&stored); err != nil {
				return http.StatusInternalServerError
			}
			if stored == fence {
				return http.StatusOK // the same call again: applied already
			}
			return http.StatusConflict // stale: a newer owner wrote
		}
	}
	if _, err := tx.Exec(ctx, `INSERT INTO effects (key, fence) VALUES ($1, $2)`, key, fence); err != nil {
		return http.StatusInternalServerError
	}
	if err := tx.Commit(ctx); err != nil {
		return http.StatusInternalServerError
	}
	return http.StatusOK
}

func setOf(list string) map[string]bool {
	m := map[string]bool{}
	for k := range strings.SplitSeq(list, ",") {
		if k != "" {
			m[k] = true
		}
	}
	return m
}
