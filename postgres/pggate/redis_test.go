package pggate_test

import (
	"context"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
	"github.com/jackc/pgx/v5"
)

// TestHybridRedis runs the gate on redisstore: the completion reaches
// Redis after the commit, and after FLUSHALL (record loss) a retry's
// effect is rolled back and Redis repaired.
func TestHybridRedis(t *testing.T) {
	v := newRedisEnv(t, 5*time.Second)
	srv, rs, pool, g := v.srv, v.rs, v.pool, v.gate
	runs := 0
	fn := func(ctx context.Context, tx pgx.Tx) ([]byte, error) {
		runs++
		_, err := tx.Exec(ctx, `INSERT INTO effects (key) VALUES ('k')`)
		return []byte("charged"), err
	}
	key := idem.Key{Scope: "pay", ID: "k"}
	if _, err := g.Do(t.Context(), key, "fp", fn); err != nil {
		t.Fatal(err)
	}
	if rec, err := rs.Get(t.Context(), key.Digest()); err != nil || rec.State != storekit.StateCompleted {
		t.Fatalf("Redis record after the commit: got %v, %v, want COMPLETED", rec.State, err)
	}
	if res, err := g.Do(t.Context(), key, "fp", fn); err != nil || !res.Replayed || runs != 1 {
		t.Fatalf("duplicate: got %+v, %v, runs %d, want a replay from Redis without running", res, err, runs)
	}
	srv.Do(t, "FLUSHALL")
	res, err := g.Do(t.Context(), key, "fp", fn)
	if err != nil || !res.Replayed || string(res.Value) != "charged" {
		t.Fatalf("retry after FLUSHALL: got %+v, %v, want the replay of charged", res, err)
	}
	var n int
	pool.QueryRow(t.Context(), `SELECT count(*) FROM effects`).Scan(&n)
	if n != 1 || runs != 2 {
		t.Fatalf("effects: got %d rows after %d runs, want 1 row after 2 runs", n, runs)
	}
	if rec, err := rs.Get(t.Context(), key.Digest()); err != nil || rec.State != storekit.StateCompleted {
		t.Fatalf("Redis record after the conflict: got %v, %v, want COMPLETED (repaired)", rec.State, err)
	}
}
