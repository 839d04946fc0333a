package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/redis/go-redis/v9"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/idemgo/idem/postgres/pggate"
	"github.com/idemgo/idem/postgres/pgoutbox"
	"github.com/idemgo/idem/postgres/pgtest"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/idemgo/idem/testkit/sqsfake"
)

// outboxSchema returns the URL of a new schema with the outbox table, and a
// pool on it.
func outboxSchema(t *testing.T) (string, *pgxpool.Pool) {
	t.Helper()
	url := pgtest.Schema(t)
	pool, err := pgxpool.New(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if err := pgoutbox.Migrate(t.Context(), pool); err != nil {
		t.Fatal(err)
	}
	return url, pool
}

func outboxPublish(t *testing.T, pool *pgxpool.Pool, dest, key, payload string) {
	t.Helper()
	err := pgx.BeginFunc(t.Context(), pool, func(tx pgx.Tx) error {
		return pgoutbox.Publish(t.Context(), tx, dest, key, []byte(payload), map[string]string{"type": "test"})
	})
	if err != nil {
		t.Fatal(err)
	}
}

func unique(prefix string) string {
	var b [5]byte
	rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// TestRelayOutbox: idem relay --once --outbox sends one row to each of the
// five brokers, each with the key where that broker's consumer adapter
// reads it by default, marks them sent, and leaves a row of a destination
// it has no route for.
func TestRelayOutbox(t *testing.T) {
	t.Parallel()
	url, pool := outboxSchema(t)

	srv := redistest.Start(t)
	stream := unique("outbox-")

	kc, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "events"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)

	queue := unique("idem-test-outbox-")
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		t.Fatalf("RabbitMQ: %v", err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, false, false, true, false, nil); err != nil { // exclusive: gone with the connection
		t.Fatal(err)
	}

	nc, err := nats.Connect("nats://127.0.0.1:4222")
	if err != nil {
		t.Fatalf("NATS: %v", err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	subject := unique("outbox.")
	st, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: strings.ReplaceAll(strings.ToUpper(subject), ".", "_"), Subjects: []string{subject}, Storage: jetstream.MemoryStorage})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { js.DeleteStream(context.Background(), st.CachedInfo().Config.Name) })

	fake := sqsfake.New("")
	hs := httptest.NewServer(fake)
	t.Cleanup(hs.Close)
	fake.SetBase(hs.URL)
	fake.CreateQueue("jobs", sqsfake.QueueOptions{})

	outboxPublish(t, pool, stream, "k-redis", "to redis")
	outboxPublish(t, pool, "events", "k-kafka", "to kafka")
	outboxPublish(t, pool, "orders", "k-amqp", "to rabbitmq")
	outboxPublish(t, pool, subject, "k-nats", "to nats")
	outboxPublish(t, pool, "jobs", "k-sqs", "to sqs")
	outboxPublish(t, pool, "elsewhere", "k-none", "no route")

	sqsURL := "sqs://" + strings.TrimPrefix(hs.URL, "http://") + "/000000000000/jobs?insecure=true&region=us-east-1"
	code, out, errOut := runIdemEnv(t, []string{"AWS_ACCESS_KEY_ID=AKIDTEST", "AWS_SECRET_ACCESS_KEY=SECRETTEST"},
		"relay", "--once", "--postgres", url,
		"--outbox", "redis-stream://"+srv.Addr()+"/"+stream,
		"--outbox", "kafka://"+strings.Join(kc.ListenAddrs(), ",")+"/events",
		"--outbox", "orders=amqp://guest:guest@127.0.0.1:5672/"+queue,
		"--outbox", "nats://127.0.0.1:4222/"+subject+" "+sqsURL)
	if code != exitOK || !strings.Contains(out, "sent 5 outbox messages") || strings.Contains(out+errOut, "guest:guest") {
		t.Fatalf("relay --once: exit %d, stdout %q, stderr %q; want 5 sent and the password hidden", code, out, errOut)
	}
	var unsentKeys []string
	rows, _ := pool.Query(t.Context(), `SELECT key FROM idem_outbox WHERE sent_at IS NULL`)
	unsentKeys, _ = pgx.CollectRows(rows, pgx.RowTo[string])
	if len(unsentKeys) != 1 || unsentKeys[0] != "k-none" {
		t.Fatalf("unsent rows: got %v, want only k-none", unsentKeys)
	}

	// Redis: field key.
	xs, err := redis.NewClient(&redis.Options{Addr: srv.Addr()}).XRange(t.Context(), stream, "-", "+").Result()
	if err != nil || len(xs) != 1 || xs[0].Values["key"] != "k-redis" || xs[0].Values["payload"] != "to redis" || xs[0].Values["type"] != "test" {
		t.Errorf("Redis stream: got %v, %v, want one entry with key k-redis", xs, err)
	}
	// Kafka: header Idempotency-Key.
	cl, err := kgo.NewClient(kgo.SeedBrokers(kc.ListenAddrs()...), kgo.ConsumeTopics("events"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	fctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	recs := cl.PollFetches(fctx).Records()
	if len(recs) != 1 || string(recs[0].Key) != "k-kafka" || len(recs[0].Headers) != 2 || recs[0].Headers[0].Key != "Idempotency-Key" || string(recs[0].Headers[0].Value) != "k-kafka" {
		t.Errorf("Kafka: got %d records (%v), want one with the key in Idempotency-Key", len(recs), recs)
	}
	// RabbitMQ: message-id.
	d, ok, err := ch.Get(queue, true)
	if err != nil || !ok || d.MessageId != "k-amqp" || string(d.Body) != "to rabbitmq" {
		t.Errorf("RabbitMQ: got %q %q (ok %v, %v), want message-id k-amqp", d.MessageId, d.Body, ok, err)
	}
	// NATS: Nats-Msg-Id.
	m, err := st.GetLastMsgForSubject(t.Context(), subject)
	if err != nil || m.Header.Get("Nats-Msg-Id") != "k-nats" || string(m.Data) != "to nats" {
		t.Errorf("NATS: got %v, want Nats-Msg-Id k-nats", err)
	}
	// SQS: attribute idempotency-key.
	if ms := fake.Messages("jobs"); len(ms) != 1 || ms[0].Attributes["idempotency-key"].StringValue != "k-sqs" || ms[0].Body != "to sqs" {
		t.Errorf("SQS: got %+v, want one message with the attribute idempotency-key k-sqs", ms)
	}
}

// TestRelayOutboxErrors: bad --outbox values are usage errors; a broker
// that is not there leaves the row unsent with its error; the URLs'
// passwords never show.
func TestRelayOutboxErrors(t *testing.T) {
	t.Parallel()
	const pw = "s3cr3tPW"
	url, pool := outboxSchema(t)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"neither redis nor outbox", nil, "--outbox"},
		{"not a URL", []string{"--outbox", "orders"}, "not a URL"},
		{"unknown scheme", []string{"--outbox", "mqtt://u:" + pw + "@h/t"}, "unknown scheme"},
		{"no queue", []string{"--outbox", "amqp://u:" + pw + "@" + closed + "/"}, "no queue"},
		{"no stream", []string{"--outbox", "redis-stream://:" + pw + "@" + closed}, "no stream"},
		{"two routes for one name", []string{"--outbox", "redis-stream://" + closed + "/s", "--outbox", "s=nats://" + closed + "/x"}, "two --outbox routes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut strings.Builder
			code := run(t.Context(), append([]string{"relay", "--once", "--postgres", url}, tc.args...), &out, &errOut, noEnv)
			all := out.String() + errOut.String()
			if code != exitUsage || !strings.Contains(all, tc.want) || strings.Contains(all, pw) {
				t.Errorf("exit %d, output %q; want exit %d, %q and the secret hidden", code, all, exitUsage, tc.want)
			}
		})
	}
	outboxPublish(t, pool, "q", "k", "p")
	var out, errOut strings.Builder
	code := run(t.Context(), []string{"relay", "--once", "--postgres", url, "--outbox", "amqp://u:" + pw + "@" + closed + "/q"}, &out, &errOut, noEnv)
	all := out.String() + errOut.String()
	if code != exitRuntime || !strings.Contains(all, "1 of 1 messages not sent") || strings.Contains(all, pw) {
		t.Fatalf("broker not there: exit %d, output %q; want exit %d, the failed send, and the secret hidden", code, all, exitRuntime)
	}
	var attempts int
	var lastErr string
	if err := pool.QueryRow(t.Context(), `SELECT attempts, last_error FROM idem_outbox WHERE sent_at IS NULL`).Scan(&attempts, &lastErr); err != nil || attempts != 1 || !strings.Contains(lastErr, "dial") {
		t.Fatalf("the row: attempts %d, last_error %q, %v; want 1 attempt and the dial error", attempts, lastErr, err)
	}
}

// runIdemEnv is runIdem with extra environment variables.
func runIdemEnv(t *testing.T, env []string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	p := startIdemEnv(t, env, args...)
	code = p.wait()
	return code, p.stdout.String(), p.stderr.String()
}

// TestRelayOutboxWithCompletions: with --redis and --outbox, relay --once
// relays the completions and sends the outbox, and says both.
func TestRelayOutboxWithCompletions(t *testing.T) {
	t.Parallel()
	url, pool := outboxSchema(t)
	if _, err := pool.Exec(t.Context(), pggate.Schema); err != nil {
		t.Fatal(err)
	}
	srv := redistest.Start(t)
	stream := unique("outbox-")
	outboxPublish(t, pool, stream, "k", "p")
	code, out, errOut := runIdem(t, "relay", "--once", "--postgres", url, "--redis", "redis://"+srv.Addr(), "--outbox", "redis-stream://"+srv.Addr()+"/"+stream)
	if code != exitOK || !strings.Contains(out, "relayed 0 completions") || !strings.Contains(out, "sent 1 outbox messages") {
		t.Fatalf("relay --once: exit %d, stdout %q, stderr %q; want both lines", code, out, errOut)
	}
}
