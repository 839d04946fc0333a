package storefull

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/testkit/redistest"
)

// The timing of the fault: the store refuses writes for fullFor, then
// takes them for freeFor, over and over. fullFor is longer than the lease,
// so a completion that falls at the start of a window is still refused
// when the Executor stops repeating it (after one lease).
const (
	lease   = time.Second
	fullFor = 1500 * time.Millisecond
	freeFor = 500 * time.Millisecond
	// work is how long the upstream takes: the gap between an acquire and
	// its completion, where a window may start.
	work = 40 * time.Millisecond
	// respSize is the size of the upstream's responses: a completion
	// writes more than an acquire.
	respSize = 32 << 10
)

// store is a store the proxy runs on, with its fault.
type store struct {
	name string
	// start starts the proxy on the store (bin is the idem binary, args
	// the proxy's other flags) and returns the proxy's address and the
	// fault's switch: full(true) makes the store refuse writes, full(false)
	// lets it take them again.
	start func(t *testing.T, bin string, args []string) (addr string, full func(bool))
}

var stores = []store{
	{"redis", func(t *testing.T, bin string, args []string) (string, func(bool)) {
		srv := redistest.Start(t, "--maxmemory-policy", "noeviction")
		_, addr := chaostest.StartProxy(t, bin, append(args, "--redis", "redis://"+srv.Addr())...)
		return addr, func(full bool) {
			limit := "0" // no limit
			if full {
				limit = "1" // below any memory in use: every write is OOM
			}
			srv.Do(t, "CONFIG", "SET", "maxmemory", limit)
		}
	}},
	{"embedded", func(t *testing.T, bin string, args []string) (string, func(bool)) {
		dir := t.TempDir()
		// The soft limit only, so that it can be raised again without
		// privileges.
		p, addr := startProxyWith(t, "prlimit", []string{"--fsize=unlimited:unlimited", "--", bin}, append(args, "--data", dir)...)
		return addr, func(full bool) {
			limit := "unlimited"
			if full {
				// Past the bbolt file's two meta pages, no write to
				// it or to its log goes through (EFBIG), as on a full
				// disk; reads do.
				limit = "8192"
			}
			if out, err := exec.Command("prlimit", "--pid", strconv.Itoa(p.Pid()), "--fsize="+limit+":").CombinedOutput(); err != nil {
				t.Fatalf("prlimit --fsize=%s: %v\n%s", limit, err, out)
			}
		}
	}},
}

// startProxyWith starts `idem proxy` through a launcher (path, with its
// own args before the binary's) and returns it with its address, as
// chaostest.StartProxy does.
func startProxyWith(t *testing.T, path string, launcher []string, args ...string) (*chaostest.Proc, string) {
	t.Helper()
	all := append(append(launcher, "proxy", "--listen", "127.0.0.1:0", "--log-format", "text"), args...)
	p := chaostest.StartCommand(t, path, all)
	line := p.ExpectStderr(`msg="idem proxy started"`, 60*time.Second)
	for f := range strings.FieldsSeq(line) {
		if addr, ok := strings.CutPrefix(f, "listen="); ok {
			return p, addr
		}
	}
	t.Fatalf("no listen= in the proxy's line %q", line)
	return nil, ""
}

// upstream counts executions per key and answers 201 with the key, the
// execution's number and padding up to respSize.
type upstream struct {
	mu    sync.Mutex
	execs map[string]int
	total atomic.Int64
}

type answer struct {
	Key  string `json:"key"`
	Exec int    `json:"exec"`
	Pad  string `json:"pad"`
}

func (u *upstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	key := r.Header.Get("Idempotency-Key")
	u.mu.Lock()
	u.execs[key]++
	n := u.execs[key]
	u.mu.Unlock()
	u.total.Add(1)
	time.Sleep(work) // the upstream works
	b, _ := json.Marshal(answer{Key: key, Exec: n, Pad: strings.Repeat("p", respSize)})
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	w.Write(b)
}

// outcome is what the clients of one key were told.
type outcome struct {
	success string // the body of the 2xx the client got, "" if none
	unknown int    // 503 TypeOutcomeUnknown answers
}

// TestStoreFullAfterAcquire is scenario 11 (see the package
// documentation), on Redis and on the embedded store, each with its
// negative control.
func TestStoreFullAfterAcquire(t *testing.T) {
	bin := chaostest.BuildIdem(t)
	keys := chaostest.Size(300, 3000)
	for _, st := range stores {
		for _, control := range []bool{false, true} {
			name := st.name
			if control {
				name += "/write-through control"
			}
			t.Run(name, func(t *testing.T) { run(t, bin, st, control, keys) })
		}
	}
}

func run(t *testing.T, bin string, st store, control bool, nkeys int) {
	up := &upstream{execs: make(map[string]int)}
	us := httptest.NewServer(up)
	t.Cleanup(us.Close)
	args := []string{"--upstream", us.URL, "--lease", lease.String()}
	if control {
		args = append(args, "--stream-all")
	}
	addr, full := st.start(t, bin, args)
	url := "http://" + addr + "/payments"
	client := &http.Client{Timeout: 30 * time.Second}

	var c chaostest.Counters
	var unknowns, unavailable, conflicts, windows atomic.Int64
	outcomes := make([]outcome, nkeys)

	// The fault: windows where the store refuses every write.
	stop := make(chan struct{})
	faultDone := make(chan struct{})
	go func() {
		defer close(faultDone)
		for {
			select {
			case <-stop:
				full(false)
				return
			case <-time.After(freeFor):
			}
			full(true)
			windows.Add(1)
			select {
			case <-stop:
				full(false)
				return
			case <-time.After(fullFor):
			}
			full(false)
		}
	}()

	// Retrying clients: each key is sent until a 2xx, pausing as
	// Retry-After says (at most a lease) after a 503 or 409.
	const workers = 8
	next := make(chan int, nkeys)
	for i := range nkeys {
		next <- i
	}
	close(next)
	deadline := time.Now().Add(10 * time.Minute)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for i := range next {
				key := fmt.Sprintf("k%d", i)
				for {
					if time.Now().After(deadline) {
						t.Errorf("key %s: no success before the deadline", key)
						return
					}
					c.Attempted.Add(1)
					status, body, err := post(client, url, key)
					switch {
					case err != nil:
						t.Errorf("key %s: %v", key, err)
						return
					case status == http.StatusCreated:
						c.Acknowledged.Add(1)
						outcomes[i].success = body
					case status == http.StatusServiceUnavailable && strings.Contains(body, idemhttp.TypeOutcomeUnknown):
						unknowns.Add(1)
						outcomes[i].unknown++
					case status == http.StatusServiceUnavailable && strings.Contains(body, idemhttp.TypeStoreUnavailable):
						unavailable.Add(1)
					case status == http.StatusConflict:
						conflicts.Add(1)
					default:
						t.Errorf("key %s: got %d %.200q", key, status, body)
						return
					}
					if outcomes[i].success != "" {
						break
					}
					time.Sleep(100 * time.Millisecond) // the client's back-off before its retry
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-faultDone

	// Every key a client was told succeeded must replay that response:
	// otherwise the client was told a success that was not recorded. A
	// key whose record was lost is still in progress until its lease
	// ends, then runs again.
	var toldWithoutRecord int64
	for i := range nkeys {
		key := fmt.Sprintf("k%d", i)
		want := outcomes[i].success
		if want == "" {
			continue
		}
		for {
			status, body, err := post(client, url, key)
			if err != nil {
				t.Fatalf("final check of %s: %v", key, err)
			}
			if status == http.StatusConflict && time.Now().Before(deadline) {
				time.Sleep(100 * time.Millisecond) // until the lease ends
				continue
			}
			if status != http.StatusCreated || body != want {
				toldWithoutRecord++
			}
			break
		}
	}

	// Every execution beyond a key's first must follow a 503
	// TypeOutcomeUnknown given to that key's client.
	var reexec, unexplained int64
	up.mu.Lock()
	for i := range nkeys {
		extra := int64(max(up.execs[fmt.Sprintf("k%d", i)]-1, 0))
		reexec += extra
		unexplained += max(extra-int64(outcomes[i].unknown), 0)
	}
	up.mu.Unlock()
	c.Executed.Store(up.total.Load())
	c.Effects.Store(up.total.Load())
	c.Duplicated.Store(reexec)
	c.Lost.Store(toldWithoutRecord)

	scenario := "store full after acquire, " + st.name
	if control {
		scenario += " (write-through control)"
	}
	chaostest.Report(t, scenario, "TestStoreFullAfterAcquire", &c, map[string]string{
		"keys":                        strconv.Itoa(nkeys),
		"full_windows":                strconv.FormatInt(windows.Load(), 10),
		"told_success_without_record": strconv.FormatInt(toldWithoutRecord, 10),
		"outcome_unknown_503":         strconv.FormatInt(unknowns.Load(), 10),
		"store_unavailable_503":       strconv.FormatInt(unavailable.Load(), 10),
		"conflicts_409":               strconv.FormatInt(conflicts.Load(), 10),
		"reexecutions":                strconv.FormatInt(reexec, 10),
		"reexecutions_unexplained":    strconv.FormatInt(unexplained, 10),
	})

	if control {
		if toldWithoutRecord == 0 {
			t.Errorf("control: no client was told a success without a record; the scenario cannot see the fault")
		}
		return
	}
	if toldWithoutRecord != 0 {
		t.Errorf("%d clients were told a success that was not recorded, want 0", toldWithoutRecord)
	}
	if unexplained != 0 {
		t.Errorf("%d re-executions followed no 503 TypeOutcomeUnknown to their key's client, want 0", unexplained)
	}
	if unknowns.Load() == 0 {
		t.Errorf("no completion was refused: the fault did not hit between an acquire and its completion")
	}
}

// post sends the scenario's request for key and returns the status and
// body.
func post(c *http.Client, url, key string) (int, string, error) {
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"amount":100}`))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Idempotency-Key", key)
	res, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res.StatusCode, string(b), err
}
