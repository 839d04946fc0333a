package redisstore_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
	"github.com/redis/go-redis/v9"
)

// streamTarget is a store with hash tag "t" plus a go-redis client on the
// same server or Cluster for the test's own stream commands.
type streamTarget struct {
	name  string
	store *redisstore.Store
	raw   redis.UniversalClient
}

func streamTargets(t *testing.T) []streamTarget {
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t, 3)
	var out []streamTarget
	tag := redisstore.WithHashTag("t")

	raw := srv.GoRedis(t)
	s, err := redisstore.New(raw, tag)
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, streamTarget{"standalone/go-redis", s, raw})
	for _, rc := range ruClients {
		out = append(out, streamTarget{"standalone/" + rc.name, rc.mustStore(t, ruOptions{addrs: []string{srv.Addr()}}, tag), raw})
	}

	craw := redis.NewClusterClient(&redis.ClusterOptions{Addrs: cl.Addrs()})
	t.Cleanup(func() { craw.Close() })
	if s, err = redisstore.New(craw, tag); err != nil {
		t.Fatal(err)
	}
	out = append(out, streamTarget{"cluster/go-redis", s, craw})
	for _, rc := range ruClients {
		out = append(out, streamTarget{"cluster/" + rc.name, rc.mustStore(t, ruOptions{addrs: cl.Addrs()}, tag), craw})
	}
	return out
}

func TestStreamScripts(t *testing.T) {
	for i, tg := range streamTargets(t) {
		t.Run(tg.name, func(t *testing.T) {
			ctx := t.Context()
			stream := "{t}:s" + string(rune('a'+i))
			dlq := stream + ":dlq"
			k1, k2 := "k1"+stream, "k2"+stream // the targets share servers
			if got, want := tg.store.Key("d"), "idem:{t}{d}"; got != want {
				t.Errorf("Key = %q, want %q", got, want)
			}
			if err := tg.store.CheckStream(stream, dlq); err != nil {
				t.Errorf("CheckStream: %v", err)
			}
			if err := tg.store.CheckStream("{u}:s", "{u}:dlq"); !errors.Is(err, idem.ErrInvalid) {
				t.Errorf("CheckStream with another tag: %v, want ErrInvalid", err)
			}
			if err := tg.raw.XGroupCreateMkStream(ctx, stream, "g", "0").Err(); err != nil {
				t.Fatal(err)
			}
			for range 3 {
				tg.raw.XAdd(ctx, &redis.XAddArgs{Stream: stream, Values: []any{"f", "v"}})
			}
			read, err := tg.raw.XReadGroup(ctx, &redis.XReadGroupArgs{Group: "g", Consumer: "c", Streams: []string{stream, ">"}, Count: 3}).Result()
			if err != nil || len(read[0].Messages) != 3 {
				t.Fatalf("XREADGROUP: %v %v", read, err)
			}
			ids := []string{read[0].Messages[0].ID, read[0].Messages[1].ID, read[0].Messages[2].ID}

			req := func(owner string) storekit.AcquireRequest {
				return storekit.AcquireRequest{Owner: owner, Lease: time.Minute, Retention: time.Hour}
			}
			acq, errs := tg.store.AcquireBatch(ctx, []string{k1, k2, k1, ""}, []storekit.AcquireRequest{req("o1"), req("o2"), req("o3"), req("o4")})
			if errs[0] != nil || errs[1] != nil || errs[2] != nil {
				t.Fatalf("AcquireBatch errors %v", errs)
			}
			if !errors.Is(errs[3], idem.ErrInvalid) {
				t.Errorf("empty key: %v, want ErrInvalid", errs[3])
			}
			if acq[0].Outcome != storekit.Acquired || acq[1].Outcome != storekit.Acquired || acq[2].Outcome != storekit.InProgress {
				t.Fatalf("outcomes %v %v %v, want acquired, acquired, in-progress", acq[0].Outcome, acq[1].Outcome, acq[2].Outcome)
			}
			if acq[0].Lease.Owner != "o1" || acq[0].Lease.Fence <= 0 {
				t.Errorf("lease %+v", acq[0].Lease)
			}

			stale := acq[1].Lease
			stale.Fence++
			errs = tg.store.CompleteAndAckBatch(ctx, stream, "g", time.Hour, []redisstore.StreamAck{
				{Key: k1, Lease: acq[0].Lease, Result: []byte("r"), ID: ids[0]},
				{Key: k2, Lease: stale, Result: []byte("r"), ID: ids[1]},
			})
			if errs[0] != nil || !errors.Is(errs[1], idem.ErrLeaseLost) {
				t.Fatalf("CompleteAndAckBatch = %v, want nil and ErrLeaseLost", errs)
			}
			// Repeating a successful call succeeds again.
			if err := tg.store.CompleteAndAck(ctx, k1, acq[0].Lease, []byte("r"), time.Hour, stream, "g", ids[0]); err != nil {
				t.Errorf("repeated CompleteAndAck: %v", err)
			}
			rec, err := tg.store.Get(ctx, k1)
			if err != nil || rec.State != storekit.StateCompleted || string(rec.Result) != "r" {
				t.Errorf("record %+v %v, want COMPLETED with r", rec, err)
			}
			if rec, _ := tg.store.Get(ctx, k2); rec.State != storekit.StateInProgress {
				t.Errorf("refused record is %v, want IN_PROGRESS", rec.State)
			}
			pend, err := tg.raw.XPendingExt(ctx, &redis.XPendingExtArgs{Stream: stream, Group: "g", Start: "-", End: "+", Count: 10}).Result()
			if err != nil || len(pend) != 2 || pend[0].ID != ids[1] {
				t.Fatalf("pending %v %v, want the two entries not completed", pend, err)
			}

			ok, err := tg.store.DeadLetter(ctx, stream, "g", ids[1], dlq, []string{"f", "v", "dlq-error", "boom"})
			if err != nil || !ok {
				t.Fatalf("DeadLetter = %v %v, want true", ok, err)
			}
			ok, err = tg.store.DeadLetter(ctx, stream, "g", ids[1], dlq, []string{"f", "v"})
			if err != nil || ok {
				t.Errorf("second DeadLetter = %v %v, want false", ok, err)
			}
			d, err := tg.raw.XRange(ctx, dlq, "-", "+").Result()
			if err != nil || len(d) != 1 || d[0].Values["dlq-error"] != "boom" {
				t.Errorf("dead-letter stream %v %v", d, err)
			}
			if n, _ := tg.raw.XPending(ctx, stream, "g").Result(); n.Count != 1 {
				t.Errorf("pending %d, want 1", n.Count)
			}
		})
	}
}

func TestHashTagOptions(t *testing.T) {
	rdb := goRedisClient(t, redistest.Start(t).Addr())
	for _, tag := range []string{"a{b", "a}", string(make([]byte, 65))} {
		if _, err := redisstore.New(rdb, redisstore.WithHashTag(tag)); !errors.Is(err, idem.ErrInvalid) {
			t.Errorf("WithHashTag(%q): %v, want ErrInvalid", tag, err)
		}
	}
	s, err := redisstore.New(rdb, redisstore.WithWait(1, time.Second))
	if err != nil {
		t.Fatal(err)
	}
	_, errs := s.AcquireBatch(t.Context(), []string{"k"}, []storekit.AcquireRequest{{Owner: "o", Lease: time.Second, Retention: time.Second}})
	if !errors.Is(errs[0], idem.ErrInvalid) {
		t.Errorf("AcquireBatch with WithWait: %v, want ErrInvalid", errs[0])
	}
	for _, tc := range []struct{ key, tag string }{{"{t}:s", "t"}, {"a{b}c", "b"}, {"{}x{y}", ""}, {"plain", ""}, {"{open", ""}} {
		if got := redisstore.KeyHashTag(tc.key); got != tc.tag {
			t.Errorf("KeyHashTag(%q) = %q, want %q", tc.key, got, tc.tag)
		}
	}
	if err := s.CheckStream("s", "s:dlq"); !errors.Is(err, idem.ErrInvalid) {
		t.Errorf("store with WithWait: CheckStream = %v, want ErrInvalid", err)
	}
	plain, err := redisstore.New(rdb)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.CheckStream("s", "s:dlq"); err != nil {
		t.Errorf("standalone store without tag: CheckStream = %v, want nil", err)
	}
}
