package main

import "testing"

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{
		{[]float64{3}, 3},
		{[]float64{3, 1, 2}, 2},
		{[]float64{4, 1, 3, 2}, 2.5},
	} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestBaseline(t *testing.T) {
	for _, c := range []struct{ name, want string }{
		{"BenchmarkConsumer/dedup/batch=100-2", "BenchmarkConsumer/plain/batch=100-2"},
		{"BenchmarkConsumer/plain/batch=1-2", "BenchmarkConsumer/plain/batch=1-2"},
		{"BenchmarkDo-2", ""},
	} {
		if got := baseline(c.name, "plain"); got != c.want {
			t.Errorf("baseline(%q) = %q, want %q", c.name, got, c.want)
		}
	}
}

func TestPairedRatio(t *testing.T) {
	// Run 2 is slow for both: the runs' own ratios are 0.5, 0.5, 1.
	got, ok := pairedRatio([]float64{5, 1, 10}, []float64{10, 2, 10})
	if !ok || got != 0.5 {
		t.Errorf("got %v, %v, want 0.5, true", got, ok)
	}
	if _, ok := pairedRatio([]float64{1}, nil); ok {
		t.Error("no baseline runs: got ok")
	}
}
