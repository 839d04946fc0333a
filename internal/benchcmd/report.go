package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
)

// row is one line of the table.
type row struct {
	Name        string    `json:"name"`
	Concurrency string    `json:"concurrency"`
	Value       float64   `json:"value"`
	Unit        string    `json:"unit"`
	RedisUsec   float64   `json:"redis_usec_per_call,omitempty"`
	RedisCPU    float64   `json:"redis_cpu_usec_per_op,omitempty"`
	RedisBusy   float64   `json:"redis_busy,omitempty"`
	RedisWait   float64   `json:"redis_waits_for_cpu,omitempty"`
	ClientCPU   float64   `json:"client_cpu_usec_per_op,omitempty"`
	Allocs      float64   `json:"client_allocs_per_op,omitempty"`
	Depth       float64   `json:"calls_per_read,omitempty"`
	Ratio       float64   `json:"ratio_to_ceiling,omitempty"`
	Note        string    `json:"note,omitempty"`
	Runs        []float64 `json:"runs,omitempty"`
}

// target is one of the project's performance targets.
type target struct {
	Name  string  `json:"name"`
	Limit string  `json:"limit"`
	Got   float64 `json:"got"`
	Unit  string  `json:"unit"`
	Pass  bool    `json:"pass"`
}

type report struct {
	RedisVersion string         `json:"redis_version"`
	GoVersion    string         `json:"go_version"`
	GOMAXPROCS   int            `json:"gomaxprocs"`
	Duration     string         `json:"duration"`
	Runs         int            `json:"runs"`
	LoadBefore   string         `json:"load_average_before,omitempty"`
	LoadAfter    string         `json:"load_average_after,omitempty"`
	Elapsed      string         `json:"elapsed"`
	Rows         []row          `json:"rows"`
	Memory       []memoryResult `json:"memory"`
	Targets      []target       `json:"targets"`
	Requests     map[string]int `json:"redis_benchmark_requests"`
	Keyspace     int            `json:"complete_ceiling_keyspace"`
}

func (b *bench) report(mem []memoryResult) *report {
	rep := &report{
		GoVersion:  runtime.Version(),
		GOMAXPROCS: runtime.GOMAXPROCS(0),
		Duration:   b.o.duration.String(),
		Runs:       b.o.runs,
		Memory:     mem,
		Requests:   b.requests,
		Keyspace:   b.completeKeyspace,
	}
	ceilLife, ceilReplay := b.med("ceiling/lifecycle"), b.med("ceiling/replay")
	ratios := map[string]float64{}
	for _, name := range b.o.stores() {
		label := name
		if name != "memstore" {
			label = "redis " + name
		}
		for _, kind := range b.o.kinds() {
			for _, c := range b.o.callers {
				key := fmt.Sprintf("%s/%s/%d", name, kind, c)
				r := row{
					Name: label + " " + kind, Concurrency: strconv.Itoa(c),
					Value: b.med(key), Unit: "ops/s", Runs: b.samples[key],
					ClientCPU: b.med(key + "/client"), Allocs: b.med(key + "/allocs"),
				}
				if name != "memstore" {
					r.RedisUsec = b.med(key + "/us")
					r.RedisCPU = b.med(key + "/cpu")
					r.RedisBusy = b.med(key + "/busy")
					r.RedisWait = b.med(key + "/wait")
					r.Depth = b.med(key + "/depth")
					if kind == "lifecycle" {
						r.Note = "µs/call: mean of acquire and complete"
					}
					if c > 1 {
						ceil := ceilLife
						if kind == "replay" {
							ceil = ceilReplay
						}
						r.Ratio = r.Value / ceil
						if kind == "lifecycle" && c == targetCallers {
							ratios[name] = r.Ratio
						}
					}
				}
				rep.Rows = append(rep.Rows, r)
			}
		}
		if name == "memstore" && !b.o.lifecycle {
			rep.Rows = append(rep.Rows, row{
				Name: "memstore Do (testing.Benchmark)", Concurrency: "1",
				Value: b.med("memstore/do/ns"), Unit: "ns/op", Runs: b.samples["memstore/do/ns"],
				Note: fmt.Sprintf("%.0f allocs/op, %.0f B/op", b.med("memstore/do/allocs"), b.med("memstore/do/bytes")),
			})
		}
	}
	cc := fmt.Sprintf("%d×P%d", ceilingClients, ceilingPipeline)
	rep.Rows = append(rep.Rows,
		row{
			Name: "ceiling acquire", Concurrency: cc, Unit: "ops/s",
			Value: b.med("ceiling/acquire"), RedisUsec: b.med("ceiling/acquire/us"),
			RedisCPU: b.med("ceiling/acquire/cpu"), RedisBusy: b.med("ceiling/acquire/busy"), RedisWait: b.med("ceiling/acquire/wait"), Runs: b.samples["ceiling/acquire"],
			Depth: b.med("ceiling/acquire/depth"),
			Note:  fmt.Sprintf("-n %d -r %d: %.1f%% of calls created a record", b.requests["acquire"], freshKeyspace, 100*b.med("ceiling/acquire/new")),
		},
		row{
			Name: "ceiling complete", Concurrency: cc, Unit: "ops/s",
			Value: b.med("ceiling/complete"), RedisUsec: b.med("ceiling/complete/us"),
			RedisCPU: b.med("ceiling/complete/cpu"), RedisBusy: b.med("ceiling/complete/busy"), RedisWait: b.med("ceiling/complete/wait"), Runs: b.samples["ceiling/complete"],
			Depth: b.med("ceiling/complete/depth"),
			Note:  fmt.Sprintf("-n %d -r %d over as many preloaded records: %.1f%% first completions", b.requests["complete"], b.completeKeyspace, 100*b.med("ceiling/complete/first")),
		},
		row{
			Name: "ceiling lifecycle", Concurrency: cc, Unit: "ops/s",
			Value: ceilLife, RedisUsec: b.med("ceiling/lifecycle/us"), Runs: b.samples["ceiling/lifecycle"],
			RedisCPU: b.med("ceiling/lifecycle/cpu"),
			Note:     "1/(1/acquire + 1/complete); µs/call: mean of the two; CPU/op: sum",
		},
	)
	if !b.o.lifecycle {
		rep.Rows = append(rep.Rows, row{
			Name: "ceiling replay", Concurrency: cc, Unit: "ops/s",
			Value: ceilReplay, RedisUsec: b.med("ceiling/replay/us"),
			RedisCPU: b.med("ceiling/replay/cpu"), RedisBusy: b.med("ceiling/replay/busy"), RedisWait: b.med("ceiling/replay/wait"), Runs: b.samples["ceiling/replay"],
			Note: fmt.Sprintf("-n %d: acquire on one completed key", b.requests["replay"]),
		})
	}
	for _, m := range mem {
		rep.Rows = append(rep.Rows, row{
			Name: fmt.Sprintf("redis memory per record, %d-B fingerprint", m.Fingerprint), Concurrency: "-",
			Value: m.BeyondBlob, Unit: "B beyond result",
			Note: fmt.Sprintf("%.1f B per record − %d B result blob, over %d records; MEMORY USAGE of one: %d B",
				m.PerRecord, m.BlobLen, m.Records, m.MemoryUsage),
		})
	}

	doNs := b.med("memstore/do/ns")
	doAllocs := b.med("memstore/do/allocs")
	rep.Targets = []target{
		// With either client (the first target asked it of the faster one,
		// at 0.7).
		{Name: "lifecycle c=64 / ceiling, go-redis", Limit: "≥ 0.80", Got: ratios["go-redis"], Unit: "×", Pass: ratios["go-redis"] >= 0.8},
		{Name: "lifecycle c=64 / ceiling, rueidis", Limit: "≥ 0.80", Got: ratios["rueidis"], Unit: "×", Pass: ratios["rueidis"] >= 0.8},
		{Name: "acquire, Redis CPU per call (ceiling phase)", Limit: "≤ 6 µs", Got: b.med("ceiling/acquire/us"), Unit: "µs", Pass: b.med("ceiling/acquire/us") <= 6},
	}
	if b.o.lifecycle {
		return rep
	}
	rep.Targets = append(rep.Targets, target{Name: "replay, Redis CPU per call (ceiling phase)", Limit: "≤ 9 µs", Got: b.med("ceiling/replay/us"), Unit: "µs", Pass: b.med("ceiling/replay/us") <= 9})
	for _, m := range mem {
		rep.Targets = append(rep.Targets, target{
			Name:  fmt.Sprintf("Redis memory per completed record beyond its result, %d-B fingerprint", m.Fingerprint),
			Limit: "≤ 200 B", Got: m.BeyondBlob, Unit: "B", Pass: m.BeyondBlob <= 200,
		})
	}
	rep.Targets = append(rep.Targets, []target{
		{Name: "memstore Do time", Limit: "≤ 2 µs", Got: doNs / 1000, Unit: "µs", Pass: doNs <= 2000},
		{Name: "memstore Do allocations", Limit: "≤ 6", Got: doAllocs, Unit: "allocs", Pass: doAllocs <= 6},
	}...)
	return rep
}

func (r *report) writeJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

func (r *report) writeText(w io.Writer) {
	fmt.Fprintf(w, "idem benchmarks: redis-server %s (loopback, no persistence), %s, GOMAXPROCS %d\n",
		r.RedisVersion, r.GoVersion, r.GOMAXPROCS)
	fmt.Fprintf(w, "each figure is the median of %d runs of %s; load average %s before, %s after; took %s\n\n",
		r.Runs, r.Duration, r.LoadBefore, r.LoadAfter, r.Elapsed)

	cells := [][]string{{"MEASUREMENT", "C", "VALUE", "UNIT", "REDIS µs/CALL", "REDIS CPU µs/OP", "REDIS BUSY", "REDIS WAITS", "CALLS/READ", "CLIENT CPU µs/OP", "ALLOCS/OP", "×CEILING", "NOTE"}}
	for _, x := range r.Rows {
		us, cpu, busy, wait, depth, client, allocs, ratio := "", "", "", "", "", "", "", ""
		if x.RedisUsec != 0 {
			us = fmt.Sprintf("%.2f", x.RedisUsec)
		}
		if x.RedisCPU != 0 {
			cpu = fmt.Sprintf("%.2f", x.RedisCPU)
		}
		if x.ClientCPU != 0 {
			client = fmt.Sprintf("%.2f", x.ClientCPU)
		}
		if x.Allocs != 0 {
			allocs = fmt.Sprintf("%.1f", x.Allocs)
		}
		if x.Depth != 0 {
			depth = fmt.Sprintf("%.1f", x.Depth)
		}
		if x.RedisBusy != 0 { // a Redis row: its waits too, 0% included
			busy = fmt.Sprintf("%.0f%%", 100*x.RedisBusy)
			wait = fmt.Sprintf("%.0f%%", 100*x.RedisWait)
		}
		if x.Ratio != 0 {
			ratio = fmt.Sprintf("%.2f", x.Ratio)
		}
		v := grouped(x.Value)
		if x.Unit != "ops/s" {
			v = fmt.Sprintf("%.1f", x.Value)
		}
		cells = append(cells, []string{x.Name, x.Concurrency, v, x.Unit, us, cpu, busy, wait, depth, client, allocs, ratio, x.Note})
	}
	writeAligned(w, cells, []bool{false, true, true, false, true, true, true, true, true, true, true, true, false})

	fmt.Fprintln(w)
	fmt.Fprintln(w, "C: concurrent callers (ceilings: redis-benchmark connections × pipeline depth). An op is one Do call;")
	fmt.Fprintln(w, "a lifecycle op is two script calls (acquire, complete), a replay op one (acquire).")
	fmt.Fprintln(w, "REDIS µs/CALL: usec_per_call of cmdstat_evalsha (INFO commandstats) after CONFIG RESETSTAT, per row:")
	fmt.Fprintln(w, "time inside the script. REDIS CPU µs/OP: CPU of the server's main thread (INFO cpu) per op, I/O")
	fmt.Fprintln(w, "included; REDIS BUSY: that CPU over the wall time; REDIS WAITS: the share of the wall time its main")
	fmt.Fprintln(w, "thread was runnable but waited for a core (/proc/PID/schedstat). CALLS/READ: script calls per read the")
	fmt.Fprintln(w, "server made from its clients' connections (total_reads_processed), how deep the pipelines it read were,")
	fmt.Fprintln(w, "lifecycle rows and ceilings (at most 16 there). CLIENT CPU µs/OP: CPU of this process (Executor, store,")
	fmt.Fprintln(w, "client library, GC) per op; ALLOCS/OP: its heap allocations per op. Ceilings run the SHAs the store")
	fmt.Fprintln(w, "sends, with arguments as long as its; ×CEILING is ops/s over the lifecycle (or replay) ceiling. go-redis:")
	fmt.Fprintln(w, "PoolSize 64; rueidis and valkey-go: defaults, DisableCache.")
	fmt.Fprintln(w)

	tc := [][]string{{"TARGET", "LIMIT", "GOT", ""}}
	for _, t := range r.Targets {
		verdict := "MISS"
		if t.Pass {
			verdict = "PASS"
		}
		tc = append(tc, []string{t.Name, t.Limit, fmt.Sprintf("%.2f %s", t.Got, t.Unit), verdict})
	}
	writeAligned(w, tc, []bool{false, false, true, false})
}

// writeAligned writes cells as columns separated by two spaces, numbers
// (right[i]) aligned right.
func writeAligned(w io.Writer, cells [][]string, right []bool) {
	width := make([]int, len(right))
	for _, line := range cells {
		for i, c := range line {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	for _, line := range cells {
		var sb strings.Builder
		for i, c := range line {
			pad := strings.Repeat(" ", width[i]-len([]rune(c)))
			if i > 0 {
				sb.WriteString("  ")
			}
			if right[i] {
				sb.WriteString(pad + c)
			} else if i < len(line)-1 {
				sb.WriteString(c + pad)
			} else {
				sb.WriteString(c)
			}
		}
		fmt.Fprintln(w, sb.String())
	}
}

// grouped formats v as an integer with thousands separators.
func grouped(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}
