package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The load generator of the rows that compare the idem proxy over HTTP/2
// with the same proxy over HTTP/1.1: wrk speaks only HTTP/1.1, so both rows
// of that pair are loaded by this Go client instead, which speaks either
// (h2c with prior knowledge, as gRPC clients without TLS do), so that the
// ratio between them compares the protocols and not two load generators.
// It runs as a process of its own, as wrk does (this program, started with
// -loadgen), so that the CPU table keeps it apart from the upstream, and
// prints wrk's lines, which runWrk's parser reads.

var (
	loadgenURL   = flag.String("loadgen", "", "run only the Go load generator against this URL for -duration (the benchmark starts itself so)")
	loadgenProto = flag.String("loadgen-proto", "h1", "with -loadgen: h1 (HTTP/1.1) or h2c (HTTP/2 without TLS, prior knowledge)")
	loadgenConns = flag.Int("loadgen-conns", 1, "with -loadgen: concurrent requests (h1: one connection each; h2c: streams multiplexed on the connections the transport opens)")
	loadgenKind  = flag.String("loadgen-kind", "new", "with -loadgen: new (a new key per request, prefixed by -loadgen-prefix) or replay")
	loadgenPfx   = flag.String("loadgen-prefix", "", "with -loadgen: the prefix of the new keys")
)

// goClient returns a client that speaks proto (h1 or h2c) to http URLs,
// keeping up to conns idle connections.
func goClient(proto string, conns int) (*http.Client, error) {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		DisableCompression:  true,
	}
	tr.Protocols = new(http.Protocols)
	switch proto {
	case "h1":
		tr.Protocols.SetHTTP1(true)
	case "h2c":
		tr.Protocols.SetUnencryptedHTTP2(true)
	default:
		return nil, fmt.Errorf("httpbench: load generator protocol %q: want h1 or h2c", proto)
	}
	return &http.Client{Transport: tr}, nil
}

// loadResult is what one load generator run measured.
type loadResult struct {
	requests int
	elapsed  time.Duration
	p50, p99 time.Duration
}

// generateLoad sends the cell's requests (kind new or replay; new keys are
// prefix-N-I) to url on conns concurrent requests for d, and returns the
// count and latencies. Any response other than 2xx, or in a protocol other
// than proto, is an error: a row never measures what it does not claim.
func generateLoad(ctx context.Context, url, proto, kind, prefix string, conns int, d time.Duration) (loadResult, error) {
	client, err := goClient(proto, conns)
	if err != nil {
		return loadResult{}, err
	}
	defer client.CloseIdleConnections()
	wantMajor := map[string]int{"h1": 1, "h2c": 2}[proto]
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu        sync.Mutex
		latencies []time.Duration
		firstErr  error
		wg        sync.WaitGroup
	)
	start := time.Now()
	end := start.Add(d)
	for g := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var mine []time.Duration
			fail := func(err error) {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				cancel()
			}
			for i := 0; time.Now().Before(end) && ctx.Err() == nil; i++ {
				key := replayKey
				if kind == "new" {
					key = prefix + "-" + strconv.Itoa(g) + "-" + strconv.Itoa(i)
				}
				req, err := http.NewRequestWithContext(ctx, "POST", url+"/pay", strings.NewReader(body))
				if err != nil {
					fail(err)
					return
				}
				req.Header.Set("Idempotency-Key", key)
				req.Header.Set("Content-Type", "application/json")
				t := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						fail(err)
					}
					return
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				lat := time.Since(t)
				switch {
				case err != nil:
					fail(err)
					return
				case resp.StatusCode < 200 || resp.StatusCode > 299:
					fail(fmt.Errorf("httpbench: %s answered %s", url, resp.Status))
					return
				case resp.ProtoMajor != wantMajor:
					fail(fmt.Errorf("httpbench: %s answered in %s, want %s", url, resp.Proto, proto))
					return
				}
				mine = append(mine, lat)
			}
			mu.Lock()
			latencies = append(latencies, mine...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return loadResult{}, firstErr
	}
	r := loadResult{requests: len(latencies), elapsed: time.Since(start)}
	if len(latencies) > 0 {
		slices.Sort(latencies)
		r.p50 = latencies[len(latencies)*50/100]
		r.p99 = latencies[min(len(latencies)-1, len(latencies)*99/100)]
	}
	return r, nil
}

// serveLoadgen is this program started with -loadgen: one run, printed as
// wrk prints it.
func serveLoadgen() {
	r, err := generateLoad(context.Background(), *loadgenURL, *loadgenProto, *loadgenKind, *loadgenPfx, *loadgenConns, *duration)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	fmt.Printf("  Latency Distribution\n     50%%  %.2fus\n     99%%  %.2fus\n", us(r.p50), us(r.p99))
	fmt.Printf("  %d requests in %.2fs\n", r.requests, r.elapsed.Seconds())
	fmt.Printf("Requests/sec: %.2f\n", float64(r.requests)/r.elapsed.Seconds())
}

// runLoadgen runs this program as the Go load generator for one cell and
// reads its output as runWrk reads wrk's.
func runLoadgen(self, url, proto, kind string, conns int, prefix string) result {
	cmd := exec.Command(self, "-loadgen", url, "-loadgen-proto", proto, "-loadgen-kind", kind,
		"-loadgen-conns", strconv.Itoa(conns), "-loadgen-prefix", prefix, "-duration", duration.String())
	return parseLoad(cmd)
}

// serveH2C serves h on a loopback port that speaks only HTTP/2 without TLS
// (an HTTP/1.1 request is refused), so that a row behind it that answers
// 2xx has reached it over HTTP/2, and returns its URL.
func serveH2C(h http.Handler, closers *[]func()) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: h, Protocols: new(http.Protocols)}
	srv.Protocols.SetUnencryptedHTTP2(true)
	go srv.Serve(ln)
	*closers = append(*closers, func() { srv.Shutdown(context.Background()) })
	return "http://" + ln.Addr().String()
}
