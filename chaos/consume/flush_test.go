package consume

import (
	"crypto/rand"
	"encoding/hex"
	"strconv"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/testkit/redistest"
)

// TestConsumeRedisFlushed: the store's redis-server is flushed (FLUSHALL)
// while messages flow from RabbitMQ through two sidecars: when the
// handler holds a call in the middle of the run, every record is gone,
// copies of every message are published, and the held call goes on (its
// sidecar can no longer complete it: the message comes again). With
// --gate the completion rows in PostgreSQL keep one effect per key: a
// key whose row committed is acked without a call, and a call that comes
// anyway finds the row and rolls back. The control (no gate, no fence
// check) writes a key again for every record the flush took, and so does
// the fence check alone: a key's first fence after its record was lost is
// seeded from the store's clock, above every earlier one, so the call it
// makes again is no stale owner and passes the check. RabbitMQ is
// the broker because a Redis stream's records must live on the stream's
// server, which FLUSHALL would empty of the stream too.
func TestConsumeRedisFlushed(t *testing.T) {
	t.Parallel()
	n := chaostest.Size(200, 4000)
	for _, tc := range []struct {
		name, mode string
		control    bool
	}{
		{"gate", "gate", false},
		{"fence", "fence", true}, // a limit: see below
		{"control", "none", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := newDB(t)
			store := redistest.Start(t)
			rdb := store.GoRedis(t)
			q := newQueue(t)
			keys := keyNames(n)
			hold := keys[n/2]
			h := startHandler(t, "127.0.0.1:0", d, tc.mode, envHold+"="+hold, envHoldAt+"=before")
			q.send(t, keys...)
			args := []string{"--from", "amqp://guest:guest@127.0.0.1:5672/" + q.name, "--to", h.url(), "--redis", "redis://" + store.Addr(),
				"--lease", "1s", "--concurrency", "2", "--batch", "10", "--retry-delay", "10ms", "--max-deliveries", "0"}
			if tc.mode == "gate" {
				args = append(args, "--gate", d.url)
			}
			var procs []*chaostest.Proc
			for range 2 {
				procs = append(procs, sidecar(t, args...))
			}
			h.held()
			before := len(d.effects(t))
			if err := rdb.FlushAll(t.Context()).Err(); err != nil {
				t.Fatal(err)
			}
			q.send(t, keys...) // every message again, after its record is gone
			h.release(1)
			waitFor(t, "every key's effect written and the queue drained", func() bool {
				return len(d.effects(t)) == n && q.ready(t) == 0 && chaostest.RabbitMQMessages(t, q.name, q.name+".retry") == 0
			})
			for _, p := range procs {
				p.Signal(15)
			}
			for _, p := range procs {
				if err := p.Wait(60e9); err != nil {
					t.Errorf("a sidecar: %v\n%s", err, p.Stderr())
				}
			}
			o := count(t, d, keys)
			left := chaostest.RabbitMQMessages(t, q.name, q.name+".retry", q.name+".dlq")
			o.lost += left
			report(t, "consume: Redis flushed mid-run, "+tc.name, "TestConsumeRedisFlushed", q.sent, q.sent-int64(left), o,
				map[string]string{"effects_before_flush": strconv.Itoa(before), "broker": "rabbitmq"})
			check(t, tc.control, o)
		})
	}
}

// queue is a RabbitMQ queue of its own on the local server, deleted with
// its retry and dead-letter queues when the test ends.
type queue struct {
	ch   *amqp.Channel
	name string
	sent int64
}

func newQueue(t *testing.T) *queue {
	t.Helper()
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		t.Fatalf("RabbitMQ on 127.0.0.1:5672: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	rand.Read(b[:])
	q := &queue{ch: ch, name: "idem-chaos-consume-" + hex.EncodeToString(b[:])}
	t.Cleanup(func() {
		for _, name := range []string{q.name, q.name + ".retry", q.name + ".dlq"} {
			ch.QueueDelete(name, false, false, false)
		}
	})
	if _, err := ch.QueueDeclare(q.name, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	return q
}

// send publishes one message per key, its message-id the key.
func (q *queue) send(t *testing.T, keys ...string) {
	t.Helper()
	for _, k := range keys {
		err := q.ch.PublishWithContext(t.Context(), "", q.name, false, false, amqp.Publishing{
			MessageId: k, Body: []byte(`{"key":"` + k + `"}`), ContentType: "application/json",
		})
		if err != nil {
			t.Fatal(err)
		}
		q.sent++
	}
}

// ready returns the queue's messages ready for delivery.
func (q *queue) ready(t *testing.T) int {
	t.Helper()
	s, err := q.ch.QueueDeclarePassive(q.name, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s.Messages
}
