package abuse

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/chaos/chaostest"
)

// slowAddedLimit is what conns slow uploads may add, in KiB, to the
// anonymous resident memory of the proxy at its default settings (its heap
// and stacks; not the binary's code pages, which grow with every feature,
// nor what the proxy held before the uploads): what they keep live, the
// bodies' memory (--max-body-memory, 32 MiB) and slowConnKiB for each
// connection (its goroutine, buffers and parsed request), twice over for
// the garbage collector's headroom (GOGC=100: the heap may reach twice
// what is live before a collection ends). Without the bounds each upload
// adds most of its 1 MiB.
func slowAddedLimit(conns int) int64 { return 2 * (slowBodyMemoryKiB + int64(conns)*slowConnKiB) }

const (
	slowBodyMemoryKiB = 32 << 10
	slowConnKiB       = 32
)

// TestSlowUploads is scenario 8, slow uploads, on Redis (the embedded
// store's fsync per request would time the disk, not the proxy), with
// the proxy at its default settings (--max-body 1MiB, --body-timeout 30s,
// --max-concurrent 1024, --max-body-memory 32MiB). Injected: 1,000
// connections, each a covered POST announcing a body of max-body − 1
// bytes; half send almost all of it at once and then one byte a second
// (bulk), half only one byte a second (trickle), for 5 s (long: 20 s);
// meanwhile a client sends a small request with a new key every 100 ms.
// The small requests are first timed alone (baseline), then during the
// uploads. Asserted: what the uploads add to the proxy's anonymous resident
// memory, sampled every 100 ms (and its peak, VmHWM), stays under
// slowAddedLimit (126.5 MiB for 1,000 connections); every small request is answered 201 and runs once; no slow upload
// reaches the upstream; the uploads the proxy refuses get 503 (the bodies'
// memory is full) or 408 (the body timeout), or find the connection reset
// before they read the answer (the proxy closes a connection whose body it
// did not read). Reported: the fast requests'
// latency (p50, p99, max), how many uploads were held to the end of the
// window, refused with 503 or ended with 408. Negative control: the same
// uploads against a proxy whose bounds are lifted (--max-body-memory 16GiB,
// --max-concurrent 0, --body-timeout 0) must go over that bound (its memory
// is sampled past the window, up to 30 s more, until it does). Uploads
// whose dial times out are reported (unconnected, control_unconnected),
// not failed: the kernel completes every connection's handshake whether
// or not the proxy accepts it (the listen backlog, somaxconn, is larger
// than the 1,000 connections), so a dial that times out is this test
// process falling behind its own 1,000 dials on a loaded machine (with
// two busy loops beside it, 129 of 1,000 did), not the proxy. A proxy
// that stopped accepting would leave the small requests unanswered, which
// fails the test; so does a run in which over a quarter of the uploads
// did not connect, too few to load the proxy.
func TestSlowUploads(t *testing.T) {
	conns := 1_000
	window := time.Duration(chaostest.Size(5, 20)) * time.Second
	bin := chaostest.BuildIdem(t)
	var c chaostest.Counters
	figures := map[string]string{"connections": strconv.Itoa(conns), "window": window.String()}

	up := newUpstream(t)
	args, _ := stores[1].start(t, bin)
	px := startProxy(t, bin, up.srv.URL, args)
	base := slowUploads(t, px, 0, 2*time.Second, true, 0)
	run := slowUploads(t, px, conns, window, true, 0)
	run.fast += base.fast
	run.fastOK += base.fastOK
	c.Attempted.Add(int64(conns) + run.fast)
	c.Acknowledged.Add(run.fastOK)
	calls := up.calls.Load()
	c.Executed.Add(calls)
	c.Effects.Add(calls)
	if calls != run.fastOK {
		c.Duplicated.Add(max(calls-run.fastOK, 0))
		t.Errorf("the upstream ran %d times, want %d: once per small request, never for a slow upload", calls, run.fastOK)
	}
	if run.fastOK != run.fast {
		c.Lost.Add(run.fast - run.fastOK)
		t.Errorf("%d of %d small requests were not answered 201", run.fast-run.fastOK, run.fast)
	}
	if run.other > 0 {
		t.Errorf("%d slow uploads got another answer than 503 or 408", run.other)
	}
	if run.unconnected > int64(conns)/4 {
		// Too few uploads to load the proxy: the memory bound below would
		// be checked against a fraction of the scenario.
		t.Errorf("only %d of %d slow uploads connected: the machine is too loaded for this scenario", int64(conns)-run.unconnected, conns)
	}
	if run.added() >= slowAddedLimit(conns) {
		t.Errorf("%d slow uploads added %s to the proxy's anonymous memory (%s before them, RSS peak %s), want below %s", conns, mib(run.added()), mib(run.idleAnon), mib(run.peakRSS), mib(slowAddedLimit(conns)))
	}
	px.alive(t)
	figures["peak_rss"] = mib(run.peakRSS)
	figures["added_anon"] = mib(run.added())
	figures["added_per_upload"] = fmt.Sprintf("%.1fKiB", float64(run.added())/float64(conns))
	figures["fast_requests"] = strconv.FormatInt(run.fast, 10)
	figures["baseline_p50"] = base.p50.Round(100 * time.Microsecond).String()
	figures["baseline_p99"] = base.p99.Round(100 * time.Microsecond).String()
	figures["fast_p50"] = run.p50.Round(100 * time.Microsecond).String()
	figures["fast_p99"] = run.p99.Round(100 * time.Microsecond).String()
	figures["fast_max"] = run.max.Round(100 * time.Microsecond).String()
	figures["held"] = strconv.FormatInt(run.held, 10)
	figures["refused_503"] = strconv.FormatInt(run.busy, 10)
	figures["ended_408"] = strconv.FormatInt(run.timedOut, 10)
	figures["reset"] = strconv.FormatInt(run.reset, 10)
	figures["unconnected"] = strconv.FormatInt(run.unconnected, 10)

	// Negative control: without the bounds the same uploads take the
	// proxy over the limit, so the check above can see the fault.
	t.Run("control without bounds", func(t *testing.T) {
		up := newUpstream(t)
		args, _ := stores[1].start(t, bin)
		px := startProxy(t, bin, up.srv.URL, args, "--max-body-memory", "16GiB", "--max-concurrent", "0", "--body-timeout", "0")
		run := slowUploads(t, px, conns, window, false, slowAddedLimit(conns))
		if run.added() < slowAddedLimit(conns) {
			t.Fatalf("without bounds the uploads added %s to the proxy's anonymous memory, want over %s: the check cannot see the fault", mib(run.added()), mib(slowAddedLimit(conns)))
		}
		figures["control_peak_rss"] = mib(run.peakRSS)
		figures["control_added_anon"] = mib(run.added())
		figures["control_unconnected"] = strconv.FormatInt(run.unconnected, 10)
	})
	chaostest.Report(t, "abuse: slow uploads", command("TestSlowUploads"), &c, figures)
}

// slowRun is what one run of slow uploads saw.
type slowRun struct {
	peakRSS                            int64 // KiB
	idleAnon, peakAnon                 int64 // KiB: before the uploads, at their peak
	fast, fastOK                       int64
	p50, p99, max                      time.Duration
	held, busy, timedOut, reset, other int64
	// unconnected counts the uploads whose dial timed out.
	unconnected int64
}

// slowUploads opens conns slow uploads to px, half bulk and half trickle
// (see TestSlowUploads), keeps them for window while sending a small
// request every 100 ms and sampling the proxy's memory, then closes them.
// With fast false it sends no small requests. With enough (KiB) above 0,
// the memory is sampled past the window until the uploads added enough
// to it, for up to 30 s: a loaded machine delivers the uploads' bytes to
// the proxy late.
func slowUploads(t *testing.T, px *proxy, conns int, window time.Duration, fast bool, enough int64) slowRun {
	t.Helper()
	const size = maxBody - 1
	var run slowRun
	var held, busy, timedOut, reset, other, unconnected atomic.Int64
	run.idleAnon = px.memory(t).anon
	stop := make(chan struct{})
	var wg sync.WaitGroup
	opened := make(chan struct{}, conns)
	for i := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			bulk := i%2 == 0
			conn, err := net.DialTimeout("tcp", px.addr, 10*time.Second)
			if err != nil {
				// Reported by the caller (see TestSlowUploads).
				if unconnected.Add(1) <= 3 {
					t.Logf("slow upload %d: %v", i, err)
				}
				opened <- struct{}{}
				return
			}
			defer conn.Close()
			// The answer, if the proxy gives one before the window ends.
			answered := make(chan int, 1)
			go func() {
				res, err := http.ReadResponse(bufio.NewReader(conn), nil)
				if err != nil {
					answered <- 0
					return
				}
				res.Body.Close()
				answered <- res.StatusCode
			}()
			first := 1
			if bulk {
				first = size - 1024
			}
			head := fmt.Sprintf("POST /uploads HTTP/1.1\r\nHost: proxy\r\nIdempotency-Key: slow-%d\r\nContent-Length: %d\r\n\r\n", i, size)
			_, err = conn.Write(append([]byte(head), make([]byte, first)...))
			opened <- struct{}{}
			tick := time.NewTicker(time.Second)
			defer tick.Stop()
			for sent := first; err == nil && sent < size-1; sent++ {
				select {
				case status := <-answered:
					count(status, &busy, &timedOut, &reset, &other)
					return
				case <-stop:
					held.Add(1)
					return
				case <-tick.C:
					_, err = conn.Write([]byte{0})
				}
			}
			// The write failed: the proxy answered and closed, or reset.
			select {
			case status := <-answered:
				count(status, &busy, &timedOut, &reset, &other)
			case <-stop:
				held.Add(1)
			}
		}()
	}
	for range conns {
		<-opened
	}

	var lat []time.Duration
	var fastWG sync.WaitGroup
	if fast {
		fastWG.Add(1)
		go func() {
			defer fastWG.Done()
			client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				start := time.Now()
				res, err := post(client, px.url("/orders"), fmt.Sprintf("fast-%d-%d", conns, i), `{"amount":1}`)
				lat = append(lat, time.Since(start))
				run.fast++
				if err == nil && res.status == http.StatusCreated && !res.replayed() {
					run.fastOK++
				}
			}
		}()
	}
	end := time.After(window)
	sample := time.NewTicker(100 * time.Millisecond)
	defer sample.Stop()
sampling:
	for {
		run.sample(px.memory(t))
		select {
		case <-end:
			break sampling
		case <-sample.C:
		}
	}
	// Past the window, a control waits up to 30 s more for the proxy to
	// take in what the uploads sent it.
	for late := time.Now().Add(30 * time.Second); run.added() < enough && time.Now().Before(late); {
		<-sample.C
		run.sample(px.memory(t))
	}
	// The peaks between two samples: the kernel keeps the highest RSS
	// (VmHWM), whose anonymous part is at least what the code's pages
	// (file-backed, RSS − RssAnon) leave of it now.
	m := px.memory(t)
	run.sample(m)
	run.peakRSS = max(run.peakRSS, m.hwm)
	run.peakAnon = max(run.peakAnon, m.hwm-(m.rss-m.anon))
	close(stop)
	fastWG.Wait()
	wg.Wait()
	if len(lat) > 0 {
		run.p50, run.p99 = chaostest.Percentile(lat, 50), chaostest.Percentile(lat, 99)
		run.max = chaostest.Percentile(lat, 100)
	}
	run.held, run.busy, run.timedOut, run.reset, run.other = held.Load(), busy.Load(), timedOut.Load(), reset.Load(), other.Load()
	run.unconnected = unconnected.Load()
	return run
}

func (r *slowRun) sample(m memory) {
	r.peakRSS = max(r.peakRSS, m.rss)
	r.peakAnon = max(r.peakAnon, m.anon)
}

// added returns what the uploads added to the proxy's anonymous memory, in
// KiB.
func (r *slowRun) added() int64 { return r.peakAnon - r.idleAnon }

// count files the proxy's answer to a slow upload (0: none, the
// connection was closed or reset).
func count(status int, busy, timedOut, reset, other *atomic.Int64) {
	switch status {
	case 0:
		reset.Add(1)
	case http.StatusServiceUnavailable:
		busy.Add(1)
	case http.StatusRequestTimeout:
		timedOut.Add(1)
	default:
		other.Add(1)
	}
}
