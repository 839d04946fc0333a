// Command benchratio reads the output of go test -bench from standard input
// and prints, for each benchmark, the median of one metric over its runs
// (-count), then the ratio of each benchmark's median to the baseline's,
// where the baseline is the benchmark of the same name whose mode is
// -base: BenchmarkConsumer/dedup/batch=100 is compared with
// BenchmarkConsumer/plain/batch=100 for -base plain. It exits with status 1
// if the input reports a failure or no benchmark with the metric. -also
// names more metrics whose medians are printed beside, without a ratio.
// -paired adds the median of each run's own ratio (the runs of a benchmark
// and of its baseline paired by rank). Used by make bench-streams:
//
//	go test -run '^$' -bench Consumer -count 5 ./consumer/redisstream/ | go run ./internal/benchratio -metric msgs/s -base plain -also redis-µs/msg,go-µs/msg
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

func main() {
	metric := flag.String("metric", "msgs/s", "the metric to compare, as go test prints its unit")
	base := flag.String("base", "plain", "the mode (a path element of the benchmark name) to compare with")
	also := flag.String("also", "", "more metrics, comma-separated, whose medians are printed beside")
	paired := flag.Bool("paired", false, "also print the median of each run's own ratio to the baseline's run of the same rank (for runs that measure a benchmark and its baseline back to back)")
	flag.Parse()
	var extra []string
	if *also != "" {
		extra = strings.Split(*also, ",")
	}

	values := map[string][]float64{}
	// extraValues[metric][benchmark] holds the -also metrics.
	extraValues := map[string]map[string][]float64{}
	for _, m := range extra {
		extraValues[m] = map[string][]float64{}
	}
	var order []string
	failed := false
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		line := sc.Text()
		fmt.Println(line)
		if strings.HasPrefix(line, "FAIL") || strings.HasPrefix(line, "--- FAIL") {
			failed = true
		}
		f := strings.Fields(line)
		if len(f) < 4 || !strings.HasPrefix(f[0], "Benchmark") {
			continue
		}
		for i := 3; i < len(f); i++ {
			if ev, ok := extraValues[f[i]]; ok {
				if v, err := strconv.ParseFloat(f[i-1], 64); err == nil {
					ev[f[0]] = append(ev[f[0]], v)
				}
			}
			if f[i] != *metric {
				continue
			}
			v, err := strconv.ParseFloat(f[i-1], 64)
			if err != nil {
				continue
			}
			name := f[0]
			if _, ok := values[name]; !ok {
				order = append(order, name)
			}
			values[name] = append(values[name], v)
		}
	}
	if err := sc.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "benchratio:", err)
		os.Exit(1)
	}
	if failed {
		fmt.Fprintln(os.Stderr, "benchratio: the benchmark failed")
		os.Exit(1)
	}
	if len(order) == 0 {
		fmt.Fprintf(os.Stderr, "benchratio: no benchmark reported %s\n", *metric)
		os.Exit(1)
	}
	medians := map[string]float64{}
	fmt.Printf("\nmedian %s over the runs, and ratio to %q", *metric, *base)
	if len(extra) > 0 {
		fmt.Printf("; medians of %s", strings.Join(extra, ", "))
	}
	fmt.Println(":")
	for _, name := range order {
		medians[name] = median(values[name])
	}
	for _, name := range order {
		ratio := ""
		if b, ok := medians[baseline(name, *base)]; ok && b > 0 {
			ratio = fmt.Sprintf("%6.2f×", medians[name]/b)
		}
		if *paired {
			if r, ok := pairedRatio(values[name], values[baseline(name, *base)]); ok {
				ratio += fmt.Sprintf(" (runs %.2f×)", r)
			}
		}
		// Small figures (µs per call) keep two decimals.
		decimals := 0
		if medians[name] < 100 {
			decimals = 2
		}
		more := ""
		for _, m := range extra {
			if v := extraValues[m][name]; len(v) > 0 {
				more += fmt.Sprintf("  %s %.2f", m, median(v))
			}
		}
		fmt.Printf("%-52s %12.*f  %7s  (%d runs)%s\n", name, decimals, medians[name], ratio, len(values[name]), more)
	}
}

// baseline returns name with its second path element replaced by mode:
// BenchmarkConsumer/dedup/batch=100-2 → BenchmarkConsumer/plain/batch=100-2.
func baseline(name, mode string) string {
	parts := strings.Split(name, "/")
	if len(parts) < 2 {
		return ""
	}
	parts[1] = mode
	return strings.Join(parts, "/")
}

// pairedRatio is the median over the runs of v[i]/base[i]: each run's
// ratio to the baseline measured in the same run, which a machine whose
// load changes from run to run moves less than the ratio of the medians.
// ok is false without runs to pair.
func pairedRatio(v, base []float64) (float64, bool) {
	var r []float64
	for i := range min(len(v), len(base)) {
		if base[i] > 0 {
			r = append(r, v[i]/base[i])
		}
	}
	if len(r) == 0 {
		return 0, false
	}
	return median(r), true
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
