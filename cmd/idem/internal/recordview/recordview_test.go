package recordview

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/idem/internal/storeopen"
	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/storekit"
)

func TestAge(t *testing.T) {
	for _, tt := range []struct {
		d    time.Duration
		want string
	}{
		{-time.Second, "0s"},
		{0, "0s"},
		{123456 * time.Microsecond, "123ms"},
		{4560 * time.Millisecond, "4.6s"},
		{time.Hour + 2*time.Minute + 3400*time.Millisecond, "1h2m3s"},
	} {
		if got := Age(tt.d); got != tt.want {
			t.Errorf("Age(%v): got %q, want %q", tt.d, got, tt.want)
		}
	}
}

func TestPrintAndList(t *testing.T) {
	ms, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	exec, err := idem.New(ms)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	inProgress := storekit.Record{State: storekit.StateInProgress, Fence: 3, Attempts: 2,
		Created: now.Add(-90 * time.Second), Now: now, LeaseUntil: now.Add(-time.Second), ExpiresAt: now.Add(time.Hour)}
	failed := storekit.Record{State: storekit.StateFailed, Fence: 1, Attempts: 5, Now: now}
	corrupt := storekit.Record{State: storekit.StateCompleted, Fence: 1, Attempts: 1, Now: now, Result: []byte("not a result")}

	var b bytes.Buffer
	if err := Print(&b, exec, "d1", "idem:d1", inProgress, true); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"digest      d1", "redis key   idem:d1", "state       IN_PROGRESS", "created     2026-01-02T03:02:35Z (1m30s ago)",
		"lease left  none: expired 1s ago; the next request takes the key over", "expires in  1h0m0s"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("Print: got\n%s\nwant a line %q", b.String(), want)
		}
	}
	b.Reset()
	if err := Print(&b, exec, "d2", "", failed, false); err != nil {
		t.Fatal(err)
	}
	if got := b.String(); strings.Contains(got, "redis key") || !strings.Contains(got, "failure   attempts exhausted") {
		t.Errorf("Print of a FAILED record without result on another store: got\n%s", got)
	}
	b.Reset()
	if err := List(&b, exec, []storeopen.Entry{{Key: "d1", Record: inProgress}, {Key: "d2", Record: failed}, {Key: "d3", Record: corrupt}}); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	want := [][]string{
		{"DIGEST", "STATE", "FENCE", "ATTEMPTS", "AGE", "EXPIRES", "IN", "STATUS", "SIZE"},
		{"d1", "IN_PROGRESS", "3", "2", "1m30s", "1h0m0s", "-", "-"},
		{"d2", "FAILED", "1", "5", "-", "-", "failed", "-"},
		{"d3", "COMPLETED", "1", "1", "-", "-", "corrupt", "12"},
	}
	if len(lines) != len(want) {
		t.Fatalf("List: got\n%s\nwant %d lines", b.String(), len(want))
	}
	for i, l := range lines {
		if got := strings.Fields(l); strings.Join(got, " ") != strings.Join(want[i], " ") {
			t.Errorf("List line %d: got %q, want %q", i, got, want[i])
		}
	}
}
