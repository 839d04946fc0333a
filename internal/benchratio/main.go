// Command benchratio reads the output of go test -bench from standard input
// and prints, for each benchmark, the median of one metric over its runs
// (-count), then the ratio of each benchmark's median to the baseline's,
// where the baseline is the benchmark of the same name whose mode is
// -base: BenchmarkConsumer/dedup/batch=100 is compared with
// BenchmarkConsumer/plain/batch=100 for -base plain. It exits with status 1
// if the input reports a failure or no benchmark with the metric. Used by
// make bench-streams:
//
//	go test -run '^$' -bench Consumer -count 5 ./consumer/redisstream/ | go run ./internal/benchratio -metric msgs/s -base plain
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
	flag.Parse()

	values := map[string][]float64{}
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
	fmt.Printf("\nmedian %s over the runs, and ratio to %q:\n", *metric, *base)
	for _, name := range order {
		medians[name] = median(values[name])
	}
	for _, name := range order {
		ratio := ""
		if b, ok := medians[baseline(name, *base)]; ok && b > 0 {
			ratio = fmt.Sprintf("%6.2f×", medians[name]/b)
		}
		// Small figures (µs per call) keep two decimals.
		decimals := 0
		if medians[name] < 100 {
			decimals = 2
		}
		fmt.Printf("%-52s %12.*f  %s  (%d runs)\n", name, decimals, medians[name], ratio, len(values[name]))
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

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
