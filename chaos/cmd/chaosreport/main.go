// Command chaosreport prints the rows a chaos run wrote (see
// chaostest.Report) as the Markdown table of RELIABILITY.md.
//
//	go run ./cmd/chaosreport chaos-report.jsonl
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"

	"github.com/idemgo/idem/chaos/chaostest"
)

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: chaosreport FILE.jsonl")
		os.Exit(2)
	}
	f, err := os.Open(os.Args[1])
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaosreport:", err)
		os.Exit(1)
	}
	defer f.Close()
	if err := write(os.Stdout, f); err != nil {
		fmt.Fprintln(os.Stderr, "chaosreport:", err)
		os.Exit(1)
	}
}

func write(w io.Writer, r io.Reader) error {
	var rows []chaostest.Row
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if strings.TrimSpace(sc.Text()) == "" {
			continue
		}
		var row chaostest.Row
		if err := json.Unmarshal(sc.Bytes(), &row); err != nil {
			return fmt.Errorf("line %d: %w", n, err)
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	fmt.Fprintln(w, "| scenario | variant | attempted | acknowledged | executed | effects | lost | duplicated | figures | command |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|---:|---|---|")
	for _, row := range rows {
		keys := make([]string, 0, len(row.Figures))
		for k := range row.Figures {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		figs := make([]string, len(keys))
		for i, k := range keys {
			figs[i] = k + " " + row.Figures[k]
		}
		fmt.Fprintf(w, "| %s | %s | %d | %d | %d | %d | %d | %d | %s | `%s` |\n",
			esc(row.Scenario), row.Variant, row.Attempted, row.Acknowledged, row.Executed,
			row.Effects, row.Lost, row.Duplicated, esc(strings.Join(figs, "; ")), row.Command)
	}
	return nil
}

func esc(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
