package boltstore

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/storekit"
)

// BenchmarkLifecycle measures new-key requests as the Executor makes them:
// Acquire of a new key, then Complete with a 200-byte result; two durable
// (fsynced) writes per request. Concurrency is the number of goroutines
// making requests; group commit is what makes 64 faster than 1.
// pages/op is the number of 4 KiB B+tree pages the checkpoints wrote per
// request (bbolt copies every page it changes); a run of fewer than about
// 30,000 requests at 64 callers fills no log and makes no checkpoint.
// p99-µs and max-µs are the latencies of the requests, so the checkpoints'
// effect on the tail shows.
func BenchmarkLifecycle(b *testing.B) {
	for _, conc := range []int{1, 64} {
		b.Run(fmt.Sprint("conc=", conc), func(b *testing.B) {
			s := openTest(b, filepath.Join(b.TempDir(), "idem.db"))
			result := make([]byte, 200)
			var seq atomic.Int64
			var mu sync.Mutex
			var lat []time.Duration
			request := func() {
				t0 := time.Now()
				key := idem.Key{ID: fmt.Sprint(seq.Add(1))}.Digest()
				a, err := s.Acquire(b.Context(), key, storekit.AcquireRequest{Fingerprint: "fingerprint", Owner: "owner", Lease: 30 * time.Second, Retention: 24 * time.Hour})
				if err != nil || a.Outcome != storekit.Acquired {
					b.Fatalf("Acquire: %v %v", a.Outcome, err)
				}
				if err := s.Complete(b.Context(), key, a.Lease, result, 24*time.Hour); err != nil {
					b.Fatalf("Complete: %v", err)
				}
				d := time.Since(t0)
				mu.Lock()
				lat = append(lat, d)
				mu.Unlock()
			}
			pagesWritten := func() int64 { st := s.db.Stats(); return st.TxStats.GetPageCount() }
			pages := pagesWritten()
			b.ResetTimer()
			start := time.Now()
			if conc == 1 {
				for b.Loop() {
					request()
				}
			} else {
				b.SetParallelism((conc + runtime.GOMAXPROCS(0) - 1) / runtime.GOMAXPROCS(0))
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						request()
					}
				})
			}
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
			b.ReportMetric(float64(pagesWritten()-pages)/float64(b.N), "pages/op")
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-µs")
		})
	}
}

// BenchmarkReplay measures Acquire of completed keys: a read transaction,
// no write.
func BenchmarkReplay(b *testing.B) {
	s := openTest(b, filepath.Join(b.TempDir(), "idem.db"))
	const nkeys = 1000
	keys := make([]string, nkeys)
	result := make([]byte, 200)
	for i := range keys {
		keys[i] = idem.Key{ID: fmt.Sprint(i)}.Digest()
		a, err := s.Acquire(b.Context(), keys[i], storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: time.Minute, Retention: time.Hour})
		if err != nil {
			b.Fatal(err)
		}
		if err := s.Complete(b.Context(), keys[i], a.Lease, result, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
	var seq atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			key := keys[seq.Add(1)%nkeys]
			a, err := s.Acquire(b.Context(), key, storekit.AcquireRequest{Fingerprint: "fp", Owner: "o2", Lease: time.Minute, Retention: time.Hour})
			if err != nil || a.Outcome != storekit.Replay || len(a.Result) != len(result) {
				b.Fatalf("Acquire: %+v %v", a, err)
			}
		}
	})
}

// BenchmarkLogAppend measures what the writer does per group besides the
// sync, which it leaves out: building a frame of one new record (as an
// Acquire writes it) and writing it to the log file, in the page cache.
func BenchmarkLogAppend(b *testing.B) {
	w, _, _, err := openLog(filepath.Join(b.TempDir(), "idem.db"), logStart{seq: 1, secret: []byte("01234567")}, 1<<62, false, false)
	if err != nil {
		b.Fatal(err)
	}
	defer w.close()
	w.sync = func(*os.File) error { return nil }
	rec := encode(&record{State: storekit.StateInProgress, Fence: 1 << 50, Attempts: 1, Created: 1 << 50, LeaseUntil: 1 << 50, ExpiresAt: 1 << 50, Fingerprint: "fingerprint", Owner: "owner"})
	es := []logEntry{{key: idem.Key{ID: "1"}.Digest(), val: rec}}
	b.ReportAllocs()
	for b.Loop() {
		if w.at > 64<<20 {
			w.at = 0 // stay within the file's first 64 MiB
		}
		if err := w.appendFrame(es, 1<<50); err != nil {
			b.Fatal(err)
		}
	}
}
