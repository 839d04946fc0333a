// Package chaostest holds what the reliability scenarios share: their size
// (short in CI, long for a local soak), the counters every scenario reports,
// the report file that RELIABILITY.md is made from, and child processes that
// a scenario can kill or pause.
package chaostest

import (
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// Long reports whether the long (soak) variant runs: IDEM_CHAOS=long, which
// `make chaos-long` sets. The default is the short, bounded variant that
// `make test` and CI run.
func Long() bool { return os.Getenv("IDEM_CHAOS") == "long" }

// Size returns short or long, as Long says.
func Size(short, long int) int {
	if Long() {
		return long
	}
	return short
}

// Counters are the counters trusted broker test suites use. Every field is
// safe for concurrent use.
type Counters struct {
	// Attempted counts the operations (requests, messages) sent.
	Attempted atomic.Int64
	// Acknowledged counts those the system under test answered as done
	// (a 2xx or a replay, an ack, a Do without error).
	Acknowledged atomic.Int64
	// Executed counts the runs of the handler (the non-idempotent code).
	Executed atomic.Int64
	// Effects counts the side effects that took effect in the sink.
	Effects atomic.Int64
	// Lost counts keys acknowledged (or sent and never dead-lettered) with
	// no effect in the sink.
	Lost atomic.Int64
	// Duplicated counts effects beyond the first per key.
	Duplicated atomic.Int64
}

// Row is one line of the report: a scenario, its counters and its figures.
type Row struct {
	Scenario     string            `json:"scenario"`
	Variant      string            `json:"variant"` // short or long
	Attempted    int64             `json:"attempted"`
	Acknowledged int64             `json:"acknowledged"`
	Executed     int64             `json:"executed"`
	Effects      int64             `json:"effects"`
	Lost         int64             `json:"lost"`
	Duplicated   int64             `json:"duplicated"`
	Figures      map[string]string `json:"figures,omitempty"`
	Command      string            `json:"command"`
}

var reportMu sync.Mutex

// Report logs the scenario's counters and figures and, when IDEM_CHAOS_REPORT
// names a file, appends them to it as one JSON line (`make chaos-report`
// turns that file into RELIABILITY.md's table). command is the command that
// reproduces the scenario.
func Report(t testing.TB, scenario, command string, c *Counters, figures map[string]string) {
	t.Helper()
	row := Row{
		Scenario: scenario, Variant: "short", Command: command, Figures: figures,
		Attempted: c.Attempted.Load(), Acknowledged: c.Acknowledged.Load(), Executed: c.Executed.Load(),
		Effects: c.Effects.Load(), Lost: c.Lost.Load(), Duplicated: c.Duplicated.Load(),
	}
	if Long() {
		row.Variant = "long"
	}
	keys := make([]string, 0, len(figures))
	for k := range figures {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var fig strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&fig, " %s=%s", k, figures[k])
	}
	t.Logf("chaos %s (%s): attempted=%d acknowledged=%d executed=%d effects=%d lost=%d duplicated=%d%s",
		scenario, row.Variant, row.Attempted, row.Acknowledged, row.Executed, row.Effects, row.Lost, row.Duplicated, fig.String())
	path := os.Getenv("IDEM_CHAOS_REPORT")
	if path == "" {
		return
	}
	line, err := json.Marshal(row)
	if err != nil {
		t.Fatalf("chaostest: %v", err)
	}
	reportMu.Lock()
	defer reportMu.Unlock()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatalf("chaostest: report: %v", err)
	}
	defer f.Close()
	if _, err := f.Write(append(line, '\n')); err != nil {
		t.Fatalf("chaostest: report: %v", err)
	}
}
