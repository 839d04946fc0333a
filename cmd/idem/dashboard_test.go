package main

import (
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// idemMetric matches the names of idem's metrics in a query.
var idemMetric = regexp.MustCompile(`\bidem_[a-z0-9_]+`)

// unexported returns the idem metric names that text queries and exported
// (the families of a /metrics page, with a histogram's _bucket, _sum and
// _count series) lacks, sorted.
func unexported(text string, exported map[string]bool) []string {
	var missing []string
	for _, name := range idemMetric.FindAllString(text, -1) {
		if !exported[name] && !slices.Contains(missing, name) {
			missing = append(missing, name)
		}
	}
	slices.Sort(missing)
	return missing
}

// exportedNames returns every series name a /metrics page can have.
func exportedNames(page string) map[string]bool {
	names := make(map[string]bool)
	for line := range strings.Lines(page) {
		f := strings.Fields(line)
		if len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			names[f[2]] = true
			if f[3] == "histogram" {
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					names[f[2]+s] = true
				}
			}
		}
	}
	return names
}

// TestDashboardMetrics: every idem metric that the Grafana dashboard and
// the alert rules in monitoring/ query is exported by the proxy's /metrics.
func TestDashboardMetrics(t *testing.T) {
	up := newUpstream(t)
	p := startProxy(t, up.url(), []string{"--data", t.TempDir()})
	post(t, p.url("/payments"), "dash-1", "x")
	res, err := http.Get("http://" + p.admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	page, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	exported := exportedNames(string(page))
	if len(exported) == 0 {
		t.Fatalf("no metric family in /metrics:\n%s", page)
	}

	// The check itself finds a name the proxy does not export.
	if got := unexported(`rate(idem_no_such_metric_total[5m]) + idem_requests_total`, exported); !slices.Equal(got, []string{"idem_no_such_metric_total"}) {
		t.Fatalf("unexported on a made-up name: got %q, want [idem_no_such_metric_total]", got)
	}

	for _, file := range []string{"grafana-dashboard.json", "alerts.yml"} {
		data, err := os.ReadFile(filepath.Join("..", "..", "monitoring", file))
		if err != nil {
			t.Fatal(err)
		}
		if len(idemMetric.FindAllString(string(data), -1)) == 0 {
			t.Errorf("monitoring/%s queries no idem metric", file)
		}
		if missing := unexported(string(data), exported); len(missing) > 0 {
			t.Errorf("monitoring/%s queries metrics the proxy does not export: %q", file, missing)
		}
	}
}
