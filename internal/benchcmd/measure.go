package main

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// counter is one worker's operation count, alone on its cache line so that
// the workers do not contend on it.
type counter struct {
	n atomic.Uint64
	_ [56]byte
}

// window is what throughput measured after the warm-up.
type window struct {
	ops  float64       // operations per second
	n    uint64        // operations completed
	wall time.Duration // length of the window
	cpu  cpuTimes      // CPU used during the window
}

// cpuTimes are CPU times in seconds, and the server's reads.
type cpuTimes struct {
	redis  float64 // the server's main thread
	client float64 // this process
	reads  float64 // the server's reads from its clients' connections (a count)
	// mallocs is this process's heap allocations (a count).
	mallocs float64
	// redisWait is the time the server's main thread was runnable but
	// waited for a core.
	redisWait float64
}

// throughput runs op on conc goroutines for warmup plus d and measures the
// d after the warm-up. Worker w passes i = 0, 1, 2, … to its calls. cpu is
// read at both ends of the window. The first error stops the measurement
// and is returned.
func throughput(ctx context.Context, conc int, warmup, d time.Duration, op func(ctx context.Context, w, i int) error, cpu func() (cpuTimes, error)) (window, error) {
	counts := make([]counter, conc)
	var stop atomic.Bool
	var firstErr error
	var errOnce sync.Once
	fail := func(err error) {
		errOnce.Do(func() { firstErr = err })
		stop.Store(true)
	}
	var wg sync.WaitGroup
	for w := range conc {
		wg.Go(func() {
			for i := 0; !stop.Load(); i++ {
				if err := op(ctx, w, i); err != nil {
					fail(err)
					return
				}
				counts[w].n.Add(1)
			}
		})
	}
	sum := func() uint64 {
		var n uint64
		for i := range counts {
			n += counts[i].n.Load()
		}
		return n
	}
	readCPU := func() cpuTimes {
		c, err := cpu()
		if err != nil {
			fail(err)
		}
		return c
	}
	ok := sleep(ctx, warmup)
	c0, n0, t0 := readCPU(), sum(), time.Now()
	ok = ok && sleep(ctx, d)
	n1, t1, c1 := sum(), time.Now(), readCPU()
	stop.Store(true)
	wg.Wait()
	if firstErr != nil {
		return window{}, firstErr
	}
	if !ok {
		return window{}, ctx.Err()
	}
	wall := t1.Sub(t0)
	return window{ops: float64(n1-n0) / wall.Seconds(), n: n1 - n0, wall: wall, cpu: cpuTimes{c1.redis - c0.redis, c1.client - c0.client, c1.reads - c0.reads, c1.mallocs - c0.mallocs, c1.redisWait - c0.redisWait}}, nil
}

// sleep waits for d or until ctx is done; it reports whether d elapsed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// median returns the median of xs (the mean of the middle two for an even
// count), or 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}
