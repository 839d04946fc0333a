package main

import (
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/idemgo/idem/testkit/readmetest"
)

// readmePath is the repository's README, from this package's directory.
const readmePath = "../../README.md"

// demoLine is one command of the README's demo block: a curl request, what
// its comment says it answers, and whether it runs in the background or
// after a pause.
type demoLine struct {
	text       string
	method     string
	target     string // path and query
	header     http.Header
	body       string
	status     int
	background bool // ends with &
	afterSleep bool // starts with sleep N;
	comment    string
}

// readmeDemo returns the commands of the README's demo block, the one after
// the line naming TestQuickStart.
func readmeDemo(t *testing.T) []demoLine {
	t.Helper()
	b, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(b), "<!-- demo: TestQuickStart")
	if !ok {
		t.Fatalf("%s has no demo block for TestQuickStart", readmePath)
	}
	_, block, _ := strings.Cut(after, "```sh\n")
	block, _, _ = strings.Cut(block, "```")
	status := regexp.MustCompile(`^\d{3}\b`)
	var out []demoLine
	for line := range strings.Lines(block) {
		words, comment := readmetest.ShellWords(strings.TrimSpace(line))
		d := demoLine{text: strings.TrimSpace(line), method: http.MethodGet, header: http.Header{}, comment: comment}
		if len(words) >= 3 && words[0] == "sleep" && words[2] == ";" {
			d.afterSleep, words = true, words[3:]
		}
		if n := len(words); n > 0 && words[n-1] == "&" {
			d.background, words = true, words[:n-1]
		}
		if len(words) == 0 || words[0] != "curl" {
			t.Fatalf("README demo: %q is not a curl command", d.text)
		}
		for i := 1; i < len(words); i++ {
			switch words[i] {
			case "-s", "-si", "-i":
			case "-X":
				i++
				d.method = words[i]
			case "-H":
				i++
				name, value, _ := strings.Cut(words[i], ":")
				d.header.Set(name, strings.TrimSpace(value))
			case "-d":
				i++
				d.body = words[i]
			default:
				_, path, ok := strings.Cut(words[i], "localhost:8080")
				if !ok {
					t.Fatalf("README demo: %q: unknown argument %q", d.text, words[i])
				}
				d.target = path
			}
		}
		s := status.FindString(comment)
		if s == "" {
			t.Fatalf("README demo: %q: the comment names no status", d.text)
		}
		d.status, _ = strconv.Atoi(s)
		out = append(out, d)
	}
	return out
}

// TestQuickStart runs the README's demo as a reader would after `make
// demo`: the toy upstream, the proxy on its embedded store, then every
// curl command of the README's demo block, each checked against the status
// (and header) its comment names; the request in the background is the
// slow one (?sleep=), and the command after `sleep 1` is sent once the toy
// API logged that it is sleeping, so it finds the key in progress. Then
// the store's files and the README's `idem get` command.
func TestQuickStart(t *testing.T) {
	t.Parallel()
	lines := readmeDemo(t)
	demoAddr := freeAddr(t)
	demo := startIdem(t, "upstream-demo", "--listen", demoAddr)
	waitLog(t, demo, "idem upstream-demo listening")
	data := t.TempDir()
	p := startProxy(t, "http://"+demoAddr, []string{"--data", data})

	var wg sync.WaitGroup
	var first response // the answer to the first command
	check := func(d demoLine) response {
		res := send(t, d.method, p.url(d.target), d.header.Get("Idempotency-Key"), d.body)
		if res.status != d.status {
			t.Errorf("%s: got %d %q, want %d", d.text, res.status, res.body, d.status)
		}
		if strings.Contains(d.comment, "Idempotent-Replayed: true") && (!res.replayed() || res.body != first.body) {
			t.Errorf("%s: got %q replayed=%v, want the first response replayed", d.text, res.body, res.replayed())
		}
		if strings.Contains(d.comment, "Retry-After") && res.header.Get("Retry-After") == "" {
			t.Errorf("%s: got no Retry-After", d.text)
		}
		if strings.Contains(d.comment, "execution 1") && !strings.Contains(res.body, `"execution": 1`) {
			t.Errorf("%s: got %q, want execution 1", d.text, res.body)
		}
		return res
	}
	for i, d := range lines {
		if d.afterSleep {
			waitLog(t, demo, "msg=sleeping")
		}
		if d.background {
			wg.Go(func() { check(d) })
			continue
		}
		if res := check(d); i == 0 {
			first = res
		}
	}
	wg.Wait()
	for _, want := range []int{201, 422, 409} {
		found := false
		for _, d := range lines {
			found = found || d.status == want
		}
		if !found {
			t.Errorf("the README's demo shows no %d", want)
		}
	}
	keys := map[string]bool{}
	for _, d := range lines {
		keys[d.header.Get("Idempotency-Key")] = true
	}
	// The toy API logs an execution before it answers, but its stderr
	// reaches demo.stderr through os/exec's copying goroutine, which may
	// not have copied the last line yet when the answer is here: count
	// once the process has exited (Wait returns after the copy).
	demo.terminate()
	demo.wait()
	if got := strings.Count(demo.stderr.String(), "msg=executed"); got != len(keys) {
		t.Errorf("upstream-demo executions: got %d, want one per key (%d)", got, len(keys))
	}

	// The files the README names in the data directory are the ones the
	// store writes.
	p.terminate()
	p.wait()
	b, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	named := regexp.MustCompile("`(idem\\.db[^`]*)`").FindAllStringSubmatch(string(b), -1)
	var want []string
	for _, m := range named {
		want = append(want, m[1])
	}
	entries, err := os.ReadDir(data)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(want)
	slices.Sort(got)
	if len(want) == 0 || !slices.Equal(got, slices.Compact(want)) {
		t.Errorf("files in the data directory: got %q, the README names %q", got, want)
	}

	// The README's command to inspect the record.
	_, cmd, ok := strings.Cut(string(b), "`bin/idem get ")
	if !ok {
		t.Fatal("the README shows no `bin/idem get` command")
	}
	cmd, _, _ = strings.Cut(cmd, "`")
	args := strings.Fields("get " + cmd)
	for i, a := range args {
		if a == "./idem-data" {
			args[i] = filepath.Clean(data)
		}
	}
	code, stdout, stderr := runIdem(t, args...)
	if code != 0 || !strings.Contains(stdout, "COMPLETED") {
		t.Errorf("idem %s: got exit %d\n%s%s\nwant the COMPLETED record", strings.Join(args, " "), code, stdout, stderr)
	}
}

// TestDataFilesAsDocumented checks that the files the proxy reference
// names for --data are the files the embedded store writes.
func TestDataFilesAsDocumented(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile("../../docs/proxy.md")
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "| `--data DIR`") {
			row = line
		}
	}
	var want []string
	for _, m := range regexp.MustCompile("`DIR/([^`]+)`").FindAllStringSubmatch(row, -1) {
		want = append(want, m[1])
	}
	data := t.TempDir()
	up := newUpstream(t)
	p := startProxy(t, up.url(), []string{"--data", data})
	post(t, p.url("/payments"), "k", "x")
	p.terminate()
	p.wait()
	entries, err := os.ReadDir(data)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(want)
	if len(want) == 0 || !slices.Equal(got, want) {
		t.Errorf("files in --data: got %q, docs/proxy.md names %q", got, want)
	}
}

// TestReadmeCommandList checks that the README's row for cmd/idem names
// every command of the binary, and nothing else.
func TestReadmeCommandList(t *testing.T) {
	b, err := os.ReadFile(readmePath)
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for line := range strings.Lines(string(b)) {
		if strings.HasPrefix(line, "| `cmd/idem` |") {
			row = line
		}
	}
	_, list, ok := strings.Cut(row, "the binary: ")
	if !ok {
		t.Fatalf("the README has no row for cmd/idem listing its commands: %q", row)
	}
	list, _, _ = strings.Cut(list, " |")
	var got, want []string
	for _, name := range strings.Split(list, ",") {
		got = append(got, strings.TrimSpace(name))
	}
	for _, c := range commands() {
		want = append(want, c.name)
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("the README lists the commands %q, the binary has %q", got, want)
	}
}
