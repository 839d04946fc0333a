package storefull

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/testkit/redistest"
)

// streamLease is the proxy's lease in TestStreamNotRecorded: the
// Executor repeats a refused completion for up to a lease, and a key left
// in progress is retried once it ends.
const streamLease = 300 * time.Millisecond

// TestStreamNotRecorded is part of scenario 11 (see the package
// documentation): responses that stream through the proxy
// (text/event-stream, and bodies over --max-response whose key must be
// marked FAILED) while Redis refuses every write. Each key's first execution makes Redis full (maxmemory
// below its use, noeviction) once the key is acquired, so its record
// cannot be written; the client reads the response to its end, Redis is
// freed, and at the end every key is retried until it gets a whole
// response. Asserted: no client read a whole first response (its end was
// withheld, and the connection aborted), and each key ran again once its
// lease ended, which the incomplete response told the client to expect.
// The negative control runs the proxy with --stream-all (written through,
// end included) and must see clean ends of unrecorded responses, each
// followed by a second execution of its key.
//
//	make chaos RUN=TestStreamNotRecorded
//	make chaos-long RUN=TestStreamNotRecorded
func TestStreamNotRecorded(t *testing.T) {
	bin := chaostest.BuildIdem(t)
	keys := chaostest.Size(40, 200)
	for _, control := range []bool{false, true} {
		name := "redis"
		if control {
			name += "/write-through control"
		}
		t.Run(name, func(t *testing.T) { runStreams(t, bin, control, keys) })
	}
}

func runStreams(t *testing.T, bin string, control bool, nkeys int) {
	srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
	full := func(on bool) {
		limit := "0"
		if on {
			limit = "1" // below any memory in use: every write is OOM
		}
		srv.Do(t, "CONFIG", "SET", "maxmemory", limit)
	}
	body := strings.Repeat("0123456789abcdef", 512) // 8 KiB, over --max-response 1KiB
	var mu sync.Mutex
	execs := make(map[string]int)
	us := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		key := r.Header.Get("Idempotency-Key")
		mu.Lock()
		execs[key]++
		n := execs[key]
		mu.Unlock()
		if n == 1 {
			full(true) // the key is held: its record cannot be written
		}
		if strings.HasSuffix(key, "-sse") {
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "data: %s %d\n\n", key, n)
			w.(http.Flusher).Flush()
			fmt.Fprint(w, "data: end\n\n")
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		io.WriteString(w, body)
	}))
	t.Cleanup(us.Close)
	args := []string{"--upstream", us.URL, "--redis", "redis://" + srv.Addr(), "--lease", streamLease.String(), "--max-response", "1KiB"}
	if control {
		args = append(args, "--stream-all")
	}
	proxy, addr := chaostest.StartProxy(t, bin, args...)
	url := "http://" + addr + "/events"
	client := &http.Client{Timeout: 30 * time.Second}

	var c chaostest.Counters
	var cleanFirst, incompleteFirst int64
	keys := make([]string, nkeys)
	for i := range keys {
		keys[i] = fmt.Sprintf("k%d-body", i)
		if i%2 == 0 {
			keys[i] = fmt.Sprintf("k%d-sse", i)
		}
	}
	// The first request of each key, one at a time: the store is full
	// from its acquire until the proxy gave up recording it (its ERROR
	// line, which must not say that the key is FAILED).
	for _, key := range keys {
		c.Attempted.Add(1)
		status, clean, err := streamPost(client, url, key)
		if err == nil {
			digest := idemhttp.PathKey(http.MethodPost, "/events", key).Digest()
			line := proxy.ExpectStderr("store_key="+digest, 30*time.Second)
			if !strings.Contains(line, "level=ERROR") || strings.Contains(line, "the key is FAILED") {
				t.Errorf("key %s: log %q, want an ERROR line that says the response was not recorded", key, line)
			}
		}
		full(false)
		switch {
		case err != nil:
			t.Fatalf("key %s: %v", key, err)
		case status != http.StatusOK:
			t.Fatalf("key %s: got %d, want a streamed 200", key, status)
		case clean:
			cleanFirst++
			c.Acknowledged.Add(1)
		default:
			incompleteFirst++
		}
	}
	// Every key again until a whole response: 409 until its lease ends,
	// then it runs again (nothing was recorded).
	deadline := time.Now().Add(5 * time.Minute)
	for _, key := range keys {
		for {
			c.Attempted.Add(1)
			status, clean, err := streamPost(client, url, key)
			if err != nil {
				t.Fatalf("retry of %s: %v", key, err)
			}
			if status == http.StatusOK && clean {
				c.Acknowledged.Add(1)
				break
			}
			if status != http.StatusConflict || time.Now().After(deadline) {
				t.Fatalf("retry of %s: got %d (whole: %v), want 409 until the lease ends, then a whole 200", key, status, clean)
			}
			time.Sleep(50 * time.Millisecond) // until the lease ends
		}
	}

	var executed, reexec int64
	mu.Lock()
	for _, key := range keys {
		executed += int64(execs[key])
		reexec += int64(max(execs[key]-1, 0))
	}
	mu.Unlock()
	c.Executed.Store(executed)
	c.Effects.Store(executed)
	// A key whose first response ended cleanly and then ran again: its
	// client was told a success that was not recorded.
	c.Duplicated.Store(min(reexec, cleanFirst))
	c.Lost.Store(cleanFirst)

	scenario := "streamed response not recorded, Redis"
	if control {
		scenario += " (write-through control)"
	}
	chaostest.Report(t, scenario, "TestStreamNotRecorded", &c, map[string]string{
		"keys":                   strconv.Itoa(nkeys),
		"clean_ends_unrecorded":  strconv.FormatInt(cleanFirst, 10),
		"incomplete_unrecorded":  strconv.FormatInt(incompleteFirst, 10),
		"reexecutions":           strconv.FormatInt(reexec, 10),
		"event_streams":          strconv.Itoa((nkeys + 1) / 2),
		"over_max_response_body": strconv.Itoa(nkeys / 2),
	})
	if control {
		if cleanFirst == 0 {
			t.Errorf("control: no client read a whole unrecorded response; the scenario cannot see the fault")
		}
		return
	}
	if cleanFirst != 0 {
		t.Errorf("%d clients read a whole response that was not recorded, want 0", cleanFirst)
	}
	if reexec != int64(nkeys) {
		t.Errorf("re-executions: got %d, want %d (one per key, after its incomplete response)", reexec, nkeys)
	}
}

// streamPost sends the scenario's request for key and reads the response
// to its end: clean is false when it broke off before (the connection was
// aborted).
func streamPost(c *http.Client, url, key string) (status int, clean bool, err error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":100}`))
	if err != nil {
		return 0, false, err
	}
	req.Header.Set("Idempotency-Key", key)
	res, err := c.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer res.Body.Close()
	_, rerr := io.ReadAll(res.Body)
	return res.StatusCode, rerr == nil, nil
}
