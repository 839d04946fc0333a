package outbox

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/postgres/pgoutbox"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/testkit/redistest"
)

// stopEvery puts a kill point at one key in stopEvery.
const stopEvery = 25

// TestOutboxRelayKilled: for each broker, rows are published to the
// outbox and a relay process sends them; at one key in 25 the relay is
// killed (SIGKILL, after it stopped itself) right after the broker
// confirmed the message and before the row was marked sent, and a new
// relay takes over. Every row reaches the broker at least once; the
// broker's idem consumer handles each key exactly once; the negative
// control, a consumer without deduplication (every message the broker
// stored), handles the repeated ones twice.
func TestOutboxRelayKilled(t *testing.T) {
	for _, b := range brokers {
		t.Run(b.name, func(t *testing.T) { testRelayKilled(t, b.name, b.setup(t)) })
	}
}

func testRelayKilled(t *testing.T, name string, br broker) {
	rows := chaostest.Size(200, 2000)
	pool, url := pgtest.Pool(t)
	if err := pgoutbox.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t)
	ctl := srv.GoRedis(t)
	keys := make([]string, rows)
	for i := range keys {
		keys[i] = fmt.Sprintf("order-%05d:created", i)
	}
	publishAll(t, pool, keys)

	env := append(br.env(), envPG+"="+url, envCtl+"="+srv.Addr(), envStopEvery+"="+strconv.Itoa(stopEvery), envUntilEmpty+"=1")
	kills := 0
	deadline := time.Now().Add(waitTimeout)
	for done := false; !done; {
		if time.Now().After(deadline) {
			t.Fatalf("the relays did not send every row within %v (%d kills)", waitTimeout, kills)
		}
		p := chaostest.StartChild(t, "relay", env...)
		for {
			line := p.Line(waitTimeout)
			if strings.HasPrefix(line, "stopped ") {
				at := time.Now()
				p.Kill()
				kills++
				if name == "nats" { // restart after the stream's duplicate window (see natsDuplicates)
					time.Sleep(time.Until(at.Add(natsDuplicates + 50*time.Millisecond)))
				}
				break
			}
			if line == "done" {
				if err := p.Wait(waitTimeout); err != nil {
					t.Fatalf("relay: %v", err)
				}
				done = true
				break
			}
		}
	}

	sent := confirmations(t, ctl, keys)
	plain := br.plain(t)
	stored := 0
	for _, n := range plain {
		stored += n
	}
	runs := br.dedup(t, ctl, stored)

	var c, control chaostest.Counters
	c.Attempted.Store(int64(rows))
	control.Attempted.Store(int64(rows))
	var sentTotal, lost, handled, dup, plainDup int
	for _, k := range keys {
		sentTotal += sent[k]
		if plain[k] == 0 {
			lost++
		}
		handled += runs[k]
		dup += max(runs[k]-1, 0)
		plainDup += max(plain[k]-1, 0)
	}
	var marked int64
	if err := pool.QueryRow(t.Context(), `SELECT count(*) FROM idem_outbox WHERE sent_at IS NOT NULL`).Scan(&marked); err != nil {
		t.Fatal(err)
	}
	c.Acknowledged.Store(marked)
	c.Executed.Store(int64(handled))
	c.Effects.Store(int64(handled))
	c.Lost.Store(int64(lost))
	c.Duplicated.Store(int64(dup))
	control.Acknowledged.Store(marked)
	control.Executed.Store(int64(stored))
	control.Effects.Store(int64(stored))
	control.Lost.Store(int64(lost))
	control.Duplicated.Store(int64(plainDup))
	figures := map[string]string{
		"kills":      strconv.Itoa(kills),
		"confirmed":  strconv.Itoa(sentTotal), // counted by the relays; a stop can fall between a confirmation and its count
		"stored":     strconv.Itoa(stored),
		"marked":     strconv.FormatInt(marked, 10),
		"batch":      "10",
		"kill_point": "after the broker's confirmation, before the mark",
	}
	if name == "nats" {
		figures["duplicate_window"] = natsDuplicates.String()
	}
	chaostest.Report(t, "outbox relay killed before the mark, "+name, "make chaos RUN=TestOutboxRelayKilled", &c, figures)
	chaostest.Report(t, "outbox relay killed before the mark, "+name+" (control: consumer without dedup)", "make chaos RUN=TestOutboxRelayKilled", &control, figures)

	wantKills := (rows + stopEvery - 1 - stopEvery/2) / stopEvery
	switch {
	case int(marked) != rows || lost != 0:
		t.Errorf("%d of %d rows marked sent, %d keys never reached the broker; want all and 0", marked, rows, lost)
	case kills != wantKills:
		t.Errorf("kills: got %d, want %d (one per kill point)", kills, wantKills)
	case sentTotal < rows+kills:
		t.Errorf("confirmed sends: got %d, want at least %d (each row once, each killed one again)", sentTotal, rows+kills)
	case handled != rows || dup != 0:
		t.Errorf("idem consumer: %d handler runs, %d duplicated; want %d and 0", handled, dup, rows)
	case plainDup < kills:
		t.Errorf("control: a consumer without dedup handled %d duplicates, want at least %d (one per kill): the scenario does not show what the consumer's dedup prevents", plainDup, kills)
	}
}

// publishAll publishes one message per key, 50 per transaction.
func publishAll(t *testing.T, pool *pgxpool.Pool, keys []string) {
	t.Helper()
	for i := 0; i < len(keys); i += 50 {
		err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
			for _, k := range keys[i:min(i+50, len(keys))] {
				if err := pgoutbox.Publish(t.Context(), tx, destination, k, []byte(`{"order":"`+k+`"}`), map[string]string{"type": "order.created"}); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
}

// confirmations returns the broker's confirmations per key that the relays
// counted.
func confirmations(t *testing.T, ctl *redis.Client, keys []string) map[string]int {
	t.Helper()
	out := make(map[string]int, len(keys))
	for i := 0; i < len(keys); i += 500 {
		part := keys[i:min(i+500, len(keys))]
		names := make([]string, len(part))
		for j, k := range part {
			names[j] = "ob:sent:" + k
		}
		vals, err := ctl.MGet(t.Context(), names...).Result()
		if err != nil {
			t.Fatal(err)
		}
		for j, v := range vals {
			if s, ok := v.(string); ok {
				out[part[j]], _ = strconv.Atoi(s)
			}
		}
	}
	return out
}
