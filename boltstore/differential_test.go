package boltstore

import (
	"bytes"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/storekit"
)

// TestSameAsMemstore runs random operations, leases that expire and
// records that are swept included, on a Store and on memstore (the
// reference of the semantics) with one fake clock, restarting the Store
// now and then, and requires identical replies: outcomes, fences, attempts,
// errors (their text), records.
func TestSameAsMemstore(t *testing.T) {
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			testSameAsMemstore(t, seed, 600)
		})
	}
}

func testSameAsMemstore(t *testing.T, seed uint64, ops int) {
	ctx := context.Background()
	clock := newFakeClock()
	path := filepath.Join(t.TempDir(), "idem.db")
	open := func() *Store {
		s, err := Open(path, WithClock(clock.Now), WithSweepInterval(0))
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	bs := open()
	defer func() { bs.Close() }()
	ms, err := memstore.New(memstore.WithClock(clock.Now))
	if err != nil {
		t.Fatal(err)
	}
	rng := mrand.New(mrand.NewPCG(seed, 99))
	keys := []string{"key-a", "key-b", "key-c"}
	durations := []time.Duration{time.Millisecond, 20 * time.Millisecond, time.Second, time.Hour}
	steps := []time.Duration{0, 0, 0, time.Microsecond, time.Millisecond, 15 * time.Millisecond, 700 * time.Millisecond, 2 * time.Second}
	leases := map[string][]storekit.Lease{} // by key, latest last
	var owners []string
	seen := map[string]int{} // outcomes and errors, to show what was covered
	pickLease := func(key string) storekit.Lease {
		ls := leases[key]
		switch n := rng.IntN(10); {
		case len(ls) == 0 || n == 0:
			return storekit.Lease{Owner: "nobody", Fence: 1 + rng.Int64N(1<<50)}
		case n < 7:
			return ls[len(ls)-1]
		default:
			return ls[rng.IntN(len(ls))]
		}
	}
	dur := func() time.Duration { return durations[rng.IntN(len(durations))] }
	sameErr := func(i int, what string, got, want error) {
		t.Helper()
		if (got == nil) != (want == nil) || (got != nil && got.Error() != want.Error()) {
			t.Fatalf("op %d %s: boltstore error %v, memstore error %v", i, what, got, want)
		}
	}
	for i := range ops {
		clock.Add(steps[rng.IntN(len(steps))])
		key := keys[rng.IntN(len(keys))]
		switch op := rng.IntN(20); {
		case op < 6:
			lease := dur()
			owner := fmt.Sprintf("owner-%d", i)
			if len(owners) > 0 && rng.IntN(5) == 0 {
				owner = owners[rng.IntN(len(owners))] // a repeated call
			}
			req := storekit.AcquireRequest{
				Fingerprint: []string{"fp", "fp", "fp", "other"}[rng.IntN(4)],
				Owner:       owner,
				Lease:       lease,
				Retention:   lease * time.Duration(1+rng.IntN(3)),
				MaxAttempts: []int{0, 0, 2, 3}[rng.IntN(4)],
			}
			got, gerr := bs.Acquire(ctx, key, req)
			want, werr := ms.Acquire(ctx, key, req)
			sameErr(i, "Acquire", gerr, werr)
			seen[got.Outcome.String()]++
			if len(got.Result) == 0 && len(want.Result) == 0 {
				got.Result, want.Result = nil, nil
			}
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("op %d Acquire(%s, %+v):\nboltstore %+v\nmemstore  %+v", i, key, req, got, want)
			}
			if got.Outcome == storekit.Acquired || got.Outcome == storekit.TakenOver {
				leases[key] = append(leases[key], got.Lease)
				owners = append(owners, owner)
			}
		case op < 9:
			l := pickLease(key)
			res := [][]byte{nil, []byte("result-1"), []byte("result-2")}[rng.IntN(3)]
			r := dur()
			err := bs.Complete(ctx, key, l, res, r)
			sameErr(i, "Complete", err, ms.Complete(ctx, key, l, res, r))
			seen[fmt.Sprint("complete err=", err != nil)]++
		case op < 11:
			l := pickLease(key)
			f := storekit.Failure{Result: []byte("failure"), Terminal: rng.IntN(3) == 0, Retention: dur(), MaxAttempts: []int{0, 2}[rng.IntN(2)]}
			got, gerr := bs.Fail(ctx, key, l, f)
			want, werr := ms.Fail(ctx, key, l, f)
			sameErr(i, "Fail", gerr, werr)
			seen["fail->"+got.String()]++
			if got != want {
				t.Fatalf("op %d Fail: boltstore %v, memstore %v", i, got, want)
			}
		case op < 13:
			l, d := pickLease(key), dur()
			err := bs.Extend(ctx, key, l, d)
			sameErr(i, "Extend", err, ms.Extend(ctx, key, l, d))
			seen[fmt.Sprint("extend err=", err != nil)]++
		case op < 15:
			l, d := pickLease(key), dur()
			sameErr(i, "Release", bs.Release(ctx, key, l, d), ms.Release(ctx, key, l, d))
		case op < 16:
			sameErr(i, "Delete", bs.Delete(ctx, key), ms.Delete(ctx, key))
		case op < 17:
			// Bad input is rejected alike.
			l := storekit.Lease{Owner: "", Fence: 1}
			sameErr(i, "Complete with bad lease", bs.Complete(ctx, key, l, nil, time.Second), ms.Complete(ctx, key, l, nil, time.Second))
			sameErr(i, "Extend with bad duration", bs.Extend(ctx, key, pickLease(key), 0), ms.Extend(ctx, key, pickLease(key), 0))
		case op < 18:
			// Restart: everything must survive.
			if err := bs.Close(); err != nil {
				t.Fatal(err)
			}
			bs = open()
		default:
		}
		for _, k := range keys {
			got, gerr := bs.Get(ctx, k)
			want, werr := ms.Get(ctx, k)
			sameErr(i, "Get "+k, gerr, werr)
			if gerr == nil {
				seen["get "+got.State.String()]++
			} else {
				seen["get absent"]++
			}
			if !got.Now.Equal(want.Now) || !got.Created.Equal(want.Created) || !got.LeaseUntil.Equal(want.LeaseUntil) || !got.ExpiresAt.Equal(want.ExpiresAt) {
				t.Fatalf("op %d Get %s times:\nboltstore %+v\nmemstore  %+v", i, k, got, want)
			}
			got.Now, got.Created, got.LeaseUntil, got.ExpiresAt = want.Now, want.Created, want.LeaseUntil, want.ExpiresAt
			if !bytes.Equal(got.Result, want.Result) {
				t.Fatalf("op %d Get %s result: boltstore %q, memstore %q", i, k, got.Result, want.Result)
			}
			got.Result = want.Result
			if !reflect.DeepEqual(got, want) {
				t.Fatalf("op %d Get %s:\nboltstore %+v\nmemstore  %+v", i, k, got, want)
			}
		}
	}
	t.Logf("covered: %v", seen)
}
