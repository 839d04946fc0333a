package observe_test

import (
	"slices"
	"testing"

	"github.com/idemgo/idem/observe"
)

// TestOutcomeString checks the names used as metric labels.
func TestOutcomeString(t *testing.T) {
	var names []string
	for _, o := range observe.Outcomes() {
		names = append(names, o.String())
	}
	want := []string{"executed", "replayed", "failed", "in-progress", "mismatch", "released", "abandoned", "lease-lost", "store-error", "not-recorded"}
	if !slices.Equal(names, want) {
		t.Errorf("got %v, want %v", names, want)
	}
	if s := observe.Outcome(200).String(); s != "invalid" {
		t.Errorf("got %q, want invalid", s)
	}
}
