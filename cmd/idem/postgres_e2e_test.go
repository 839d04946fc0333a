package main

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"
)

// TestProxyOnPostgres: the proxy with --postgres (pgstore) runs the
// upstream once per key and replays; doctor --postgres then passes.
func TestProxyOnPostgres(t *testing.T) {
	url := pgtest.Schema(t)
	code, out, _ := runIdem(t, "doctor", "--postgres", url)
	if code != exitRuntime || !strings.Contains(out, "FAIL  tables") || !strings.Contains(out, "Migrate") {
		t.Fatalf("doctor on an empty schema: exit %d, output:\n%s\nwant FAIL on the tables naming Migrate", code, out)
	}
	up := newUpstream(t)
	addr, admin := freeAddr(t), freeAddr(t)
	ctx, cancel := context.WithCancel(t.Context())
	var stdout, stderr syncBuffer
	exited := make(chan int, 1)
	go func() {
		exited <- run(ctx, []string{"proxy", "--listen", addr, "--admin-listen", admin, "--upstream", up.url(),
			"--postgres", url, "--lease", "2s"}, &stdout, &stderr, noEnv)
	}()
	defer func() { cancel(); <-exited }()
	deadline := time.Now().Add(readyTimeout)
	for {
		res, err := http.Get("http://" + admin + "/readyz")
		if err == nil {
			res.Body.Close()
			if res.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("proxy not ready: %v\n%s", err, stderr.String())
		}
		time.Sleep(20 * time.Millisecond) // poll until the proxy serves
	}
	first := post(t, "http://"+addr+"/pay", "k1", "amount=1")
	second := post(t, "http://"+addr+"/pay", "k1", "amount=1")
	if first.status != 201 || second.status != 201 || second.body != first.body || up.executions("k1") != 1 {
		t.Fatalf("got %d %q then %d %q with %d executions, want the same 201 twice and 1 execution; log:\n%s",
			first.status, first.body, second.status, second.body, up.executions("k1"), stderr.String())
	}
	code, out, _ = runIdem(t, "doctor", "--postgres", url)
	if code != exitOK || !strings.Contains(out, "OK    pgstore functions") {
		t.Fatalf("doctor after the proxy migrated: exit %d, output:\n%s", code, out)
	}
}

// TestRelayOnce: a completion the store did not get is copied into Redis
// by idem relay --once, and doctor --postgres reports the backlog first.
func TestRelayOnce(t *testing.T) {
	url := pgtest.Schema(t)
	srv := redistest.Start(t)
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	rs, err := redisstore.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	e, err := idem.New(rs)
	if err != nil {
		t.Fatal(err)
	}
	g, err := pggate.New(e, pool, pggate.WithRelayInterval(0))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	// A completion committed 2 minutes ago by an owner that died before
	// Redis heard of it, after the relay's last pass (3 minutes ago).
	if _, err := pool.Exec(t.Context(), `UPDATE idem_completions_relay SET created_at = now() - interval '3 minutes'`); err != nil {
		t.Fatal(err)
	}
	key := idem.Key{Scope: "s", ID: "k"}.Digest()
	if _, err := pool.Exec(t.Context(), `INSERT INTO idem_completions (digest, fingerprint, fence, result, created_at, expires_at)
VALUES ($1, 'fp', 7, '\x006f6b', now() - interval '2 minutes', now() + interval '1 hour')`, key); err != nil {
		t.Fatal(err)
	}
	// A multi-step request whose owner stopped after its first step, its
	// claim ended 2 minutes ago.
	if _, err := pool.Exec(t.Context(), `INSERT INTO idem_completions (digest, fingerprint, fence, result, expires_at, relayed, progress)
VALUES ('abandoned', 'fp', 0, '', now() + interval '1 hour', true,
  jsonb_build_object('flow', 'checkout', 'step', 'order', 'owner', 'x', 'until', now() - interval '2 minutes'))`); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runIdem(t, "doctor", "--postgres", url, "--redis", "redis://"+srv.Addr())
	if !strings.Contains(out, "WARN  relay backlog: 1 completions") {
		t.Fatalf("doctor: exit %d, output:\n%s\nwant a WARN for the relay backlog", code, out)
	}
	if !strings.Contains(out, "WARN  abandoned multi-step requests: 1 requests") {
		t.Fatalf("doctor: exit %d, output:\n%s\nwant a WARN for the abandoned multi-step request", code, out)
	}
	code, out, errOut := runIdem(t, "relay", "--once", "--postgres", url, "--redis", "redis://"+srv.Addr())
	if code != exitOK || !strings.Contains(out, "relayed 1 completions") {
		t.Fatalf("relay --once: exit %d, stdout %q, stderr %q", code, out, errOut)
	}
	rec, err := rs.Get(t.Context(), key)
	if err != nil || rec.State != storekit.StateCompleted || string(rec.Result) != "\x00ok" || rec.Fence != 7 {
		t.Fatalf("Redis record after the relay: got %+v, %v, want COMPLETED with the row's result and fence", rec, err)
	}
	if code, _, errOut := runIdem(t, "relay", "--once", "--postgres", url); code != exitUsage || !strings.Contains(errOut, "--redis") {
		t.Fatalf("relay without --redis: exit %d, stderr %q, want a usage error naming --redis", code, errOut)
	}
}
