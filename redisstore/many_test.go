package redisstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/storetest"
	"github.com/idemgo/idem/testkit/redistest"
)

// viaBatch is a Store whose Acquire and Complete go through the batch
// scripts (acquire_many, complete_many): each call is sent as a batch of
// the same call twice. The second is a repeat by the same owner, which the
// Store contract makes harmless (Acquired again with the same fence, or the
// same complete again), so the first reply is exactly what a one-key call
// would return, computed by the batch script.
type viaBatch struct{ *redisstore.Store }

func (s viaBatch) Acquire(ctx context.Context, key string, req storekit.AcquireRequest) (storekit.Acquisition, error) {
	acqs, errs := s.AcquireBatch(ctx, []string{key, key}, []storekit.AcquireRequest{req, req})
	return acqs[0], errs[0]
}

func (s viaBatch) Complete(ctx context.Context, key string, lease storekit.Lease, result []byte, retention time.Duration) error {
	return s.CompleteBatch(ctx, []string{key, key}, []storekit.Lease{lease, lease}, [][]byte{result, result}, retention)[0]
}

// TestConformanceBatchScripts runs the conformance suite with Acquire and
// Complete made by the batch scripts, on a standalone server and on a
// Cluster with a hash tag (where batches share a script), through both
// clients: the batch scripts implement the transitions of the one-key
// scripts.
func TestConformanceBatchScripts(t *testing.T) {
	t.Parallel()
	standalone := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	for _, c := range clients(t, standalone, cluster) {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var opts []redisstore.Option
			if strings.HasPrefix(c.name, "cluster") {
				opts = append(opts, redisstore.WithHashTag("batch"))
			}
			s := viaBatch{c.newStore(t, opts...)}
			storetest.Run(t, func(*testing.T) storekit.Store { return s })
		})
	}
}

// TestBatchScriptForeignRecord checks that a key holding a value in
// another format fails alone in a batch script: the other keys of the batch
// get their own outcomes, and the foreign value is left as it was.
func TestBatchScriptForeignRecord(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s, err := redisstore.New(goRedisClient(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{
		idem.Key{ID: "a"}.Digest(),
		idem.Key{ID: "foreign"}.Digest(),
		idem.Key{ID: "b"}.Digest(),
	}
	if _, err := srv.Command("SET", s.Key(keys[1]), "\x92\x02\xa1x"); err != nil { // MessagePack, version 2
		t.Fatal(err)
	}
	req := storekit.AcquireRequest{Owner: "o", Lease: time.Minute, Retention: time.Hour}
	acqs, errs := s.AcquireBatch(t.Context(), keys, []storekit.AcquireRequest{req, req, req})
	for _, i := range []int{0, 2} {
		if errs[i] != nil || acqs[i].Outcome != storekit.Acquired {
			t.Fatalf("key %d: %+v, %v; want Acquired", i, acqs[i], errs[i])
		}
	}
	if errs[1] == nil || !strings.Contains(errs[1].Error(), "unknown record format") {
		t.Fatalf("foreign key: got %+v, %v; want the unknown-format error", acqs[1], errs[1])
	}
	leases := []storekit.Lease{acqs[0].Lease, {Owner: "o", Fence: 1}, acqs[2].Lease}
	cerrs := s.CompleteBatch(t.Context(), keys, leases, [][]byte{[]byte("ra"), nil, []byte("rb")}, time.Hour)
	if cerrs[0] != nil || cerrs[2] != nil || cerrs[1] == nil || !strings.Contains(cerrs[1].Error(), "unknown record format") {
		t.Fatalf("complete: %v", cerrs)
	}
	if got, _ := srv.Command("GET", s.Key(keys[1])); got != "\x92\x02\xa1x" {
		t.Fatalf("the foreign value became %q", got)
	}
}

// TestBatchScriptChunks sends batches larger than one script takes, with
// leases that differ in the middle: every key gets its outcome, in order,
// whatever script carried it.
func TestBatchScriptChunks(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s, err := redisstore.New(goRedisClient(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	keys := make([]string, n)
	reqs := make([]storekit.AcquireRequest, n)
	for i := range keys {
		keys[i] = idem.Key{ID: fmt.Sprint(i)}.Digest()
		reqs[i] = storekit.AcquireRequest{Owner: fmt.Sprint("o", i), Lease: time.Minute, Retention: time.Hour}
		if i >= 100 && i < 110 {
			reqs[i].Lease = 2 * time.Minute
		}
	}
	keys[299], reqs[299] = keys[0], storekit.AcquireRequest{Owner: "other", Lease: time.Minute, Retention: time.Hour}
	acqs, errs := s.AcquireBatch(t.Context(), keys, reqs)
	leases := make([]storekit.Lease, n)
	results := make([][]byte, n)
	for i := range n - 1 {
		if errs[i] != nil || acqs[i].Outcome != storekit.Acquired || acqs[i].Lease.Owner != reqs[i].Owner {
			t.Fatalf("key %d: %+v, %v", i, acqs[i], errs[i])
		}
		leases[i], results[i] = acqs[i].Lease, []byte(fmt.Sprint("r", i))
	}
	if errs[n-1] != nil || acqs[n-1].Outcome != storekit.InProgress {
		t.Fatalf("a repeated key, another owner: %+v, %v; want InProgress", acqs[n-1], errs[n-1])
	}
	for i := 100; i < 110; i++ {
		rec, err := s.Get(t.Context(), keys[i])
		if err != nil || rec.LeaseUntil.Sub(rec.Now) < 90*time.Second {
			t.Fatalf("key %d: the 2-minute lease became %v (%v)", i, rec.LeaseUntil.Sub(rec.Now), err)
		}
	}
	leases[n-1] = storekit.Lease{Owner: "other", Fence: 1}
	for i, err := range s.CompleteBatch(t.Context(), keys, leases, results, time.Hour) {
		if i == n-1 {
			if !errors.Is(err, idem.ErrLeaseLost) {
				t.Fatalf("complete by a non-owner: %v, want ErrLeaseLost", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("complete %d: %v", i, err)
		}
	}
	acqs, errs = s.AcquireBatch(t.Context(), keys[:n-1], reqs[:n-1])
	for i := range n - 1 {
		if errs[i] != nil || acqs[i].Outcome != storekit.Replay || string(acqs[i].Result) != fmt.Sprint("r", i) {
			t.Fatalf("replay %d: %+v, %v", i, acqs[i], errs[i])
		}
	}
}

// TestGetRefusesWrongFieldTypes writes records in idem's format whose
// fields have the wrong type (as no script of idem writes them): Get
// refuses them with an error instead of reading the field as empty or 0.
func TestGetRefusesWrongFieldTypes(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	s, err := redisstore.New(goRedisClient(t, srv.Addr()))
	if err != nil {
		t.Fatal(err)
	}
	good := func() [][]byte {
		f := [][]byte{msgpackUint(nil, 1), msgpackStr(nil, "c"), msgpackStr(nil, "fp"), msgpackStr(nil, ""),
			msgpackUint(nil, 7), msgpackUint(nil, 0), msgpackUint(nil, 1), msgpackUint(nil, 0), msgpackStr(nil, "result")}
		return f
	}
	encode := func(fields [][]byte) string {
		var b []byte
		for _, f := range fields {
			b = append(b, f...)
		}
		return string(b)
	}
	key := idem.Key{ID: "typed"}.Digest()
	if _, err := srv.Command("SET", s.Key(key), encode(good())); err != nil {
		t.Fatal(err)
	}
	if rec, err := s.Get(t.Context(), key); err != nil || rec.State != storekit.StateCompleted || string(rec.Result) != "result" {
		t.Fatalf("well-formed record: %+v, %v", rec, err)
	}
	for i, name := range map[int]string{2: "fingerprint", 3: "owner", 8: "result"} {
		fields := good()
		fields[i] = msgpackUint(nil, 5) // a number where a string belongs
		if _, err := srv.Command("SET", s.Key(key), encode(fields)); err != nil {
			t.Fatal(err)
		}
		if rec, err := s.Get(t.Context(), key); err == nil || !strings.Contains(err.Error(), "wrong type") {
			t.Errorf("%s as a number: got %+v, %v; want a wrong-type error", name, rec, err)
		}
	}
	for i, name := range map[int]string{4: "fence", 6: "attempts"} {
		fields := good()
		fields[i] = msgpackStr(nil, "x") // a string where a number belongs
		if _, err := srv.Command("SET", s.Key(key), encode(fields)); err != nil {
			t.Fatal(err)
		}
		if rec, err := s.Get(t.Context(), key); err == nil || !strings.Contains(err.Error(), "wrong type") {
			t.Errorf("%s as a string: got %+v, %v; want a wrong-type error", name, rec, err)
		}
	}
}

// TestAttemptLimitArguments checks the arguments that acquire.lua takes
// only with an attempt limit (max attempts, and the retention of a record
// that the limit ends FAILED), through Acquire and through a batch that
// mixes keys with and without a limit: the exhausted key ends FAILED with
// the retention as its expiry, not the IN_PROGRESS time to live, and the
// key without a limit is taken again.
func TestAttemptLimitArguments(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	c := goRedisClient(t, srv.Addr())
	s := newStore(t, c)
	ctx := t.Context()
	limited := storekit.AcquireRequest{Fingerprint: "fp", Owner: "o1", Lease: time.Minute, Retention: time.Hour, MaxAttempts: 1}
	unlimited := storekit.AcquireRequest{Fingerprint: "fp", Owner: "o1", Lease: time.Minute, Retention: time.Hour}
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			keys := []string{idem.Key{ID: fmt.Sprint("limited-", batch)}.Digest(), idem.Key{ID: fmt.Sprint("unlimited-", batch)}.Digest()}
			acquire := func(reqs []storekit.AcquireRequest) ([]storekit.Acquisition, []error) {
				if batch {
					return s.AcquireBatch(ctx, keys, reqs)
				}
				out, errs := make([]storekit.Acquisition, len(keys)), make([]error, len(keys))
				for i, key := range keys {
					out[i], errs[i] = s.Acquire(ctx, key, reqs[i])
				}
				return out, errs
			}
			acqs, errs := acquire([]storekit.AcquireRequest{limited, unlimited})
			for i, key := range keys {
				if errs[i] != nil || acqs[i].Outcome != storekit.Acquired {
					t.Fatalf("first acquire of key %d: got %+v, %v; want Acquired", i, acqs[i], errs[i])
				}
				if err := s.Release(ctx, key, acqs[i].Lease, time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			l2, u2 := limited, unlimited
			l2.Owner, u2.Owner = "o2", "o2"
			acqs, errs = acquire([]storekit.AcquireRequest{l2, u2})
			if errs[0] != nil || acqs[0].Outcome != storekit.Replay || acqs[0].State != storekit.StateFailed {
				t.Fatalf("acquire past the limit: got %+v, %v; want Replay of FAILED", acqs[0], errs[0])
			}
			if errs[1] != nil || acqs[1].Outcome != storekit.Acquired || acqs[1].Attempts != 2 {
				t.Fatalf("acquire without a limit: got %+v, %v; want Acquired, attempt 2", acqs[1], errs[1])
			}
			ttl, err := c.PTTL(ctx, s.Key(keys[0])).Result()
			if err != nil {
				t.Fatal(err)
			}
			if ttl <= 10*time.Minute || ttl > time.Hour {
				t.Fatalf("the FAILED record expires in %v, want the retention (1h)", ttl)
			}
		})
	}
}
