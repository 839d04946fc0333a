package main

import (
	"net"
	"strings"
	"testing"

	"github.com/idemgo/idem/postgres/pgtest"
)

// TestQuerySecretsRedacted: a secret given as a query parameter of a URL
// flag (?password=, which pgx and libpq accept, ?token=, ?api_key=, ...) or
// as a keyword of a Postgres connection string never appears in what the
// command prints, on every flag's error path: the URL rejected when the
// flags are read, and the client's own error when the server is not there.
func TestQuerySecretsRedacted(t *testing.T) {
	t.Parallel()
	const pw = "s3cr3tPW"
	up := newUpstream(t)
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := l.Addr().String()
	l.Close()
	pg := pgtest.Schema(t)
	for _, tc := range []struct {
		name string
		args []string
		want string // in the output: the error meant
	}{
		{"redis password", []string{"proxy", "--upstream", up.url(), "--redis", "redis://localhost:6379/0?password=" + pw}, "xxxxx"},
		{"redis token", []string{"get", "k", "--redis", "redis://localhost:6379?dial_timeout=1s&auth_token=" + pw}, "xxxxx"},
		{"redis encoded", []string{"ls", "--redis", "redis://localhost:6379?Password=" + strings.Replace(pw, "P", "%50", 1)}, "xxxxx"},
		{"redis-cluster", []string{"ls", "--redis-cluster", "redis://localhost:7000?addr=localhost:7001&password=" + pw}, "xxxxx"},
		{"postgres bad option", []string{"ls", "--postgres", "postgres://u@localhost:5432/db?password=" + pw + "&sslmode=bogus"}, "xxxxx"},
		{"postgres sslpassword", []string{"ls", "--postgres", "postgres://u@localhost:5432/db?sslpassword=" + pw + "&sslmode=bogus"}, "xxxxx"},
		{"postgres keywords", []string{"ls", "--postgres", "host=localhost password=" + pw + " sslmode=bogus"}, "xxxxx"},
		{"postgres quoted keyword", []string{"ls", "--postgres", "host=localhost password='" + pw + " x' sslmode=bogus"}, "xxxxx"},
		{"postgres unreachable", []string{"ls", "--postgres", "postgres://u@" + closed + "/db?connect_timeout=2&password=" + pw}, "not reachable"},
		{"doctor postgres", []string{"doctor", "--postgres", "postgres://u@" + closed + "/db?password=" + pw}, "not reachable"},
		{"relay postgres", []string{"relay", "--once", "--redis", "redis://" + closed, "--postgres", "postgres://u@localhost:5432/db?password=" + pw + "&sslmode=bogus"}, "xxxxx"},
		{"relay redis", []string{"relay", "--once", "--postgres", pg, "--redis", "redis://" + closed + "?password=" + pw}, "xxxxx"},
		{"relay unreachable", []string{"relay", "--once", "--redis", "redis://" + closed, "--postgres", "postgres://u@" + closed + "/db?password=" + pw}, "not reachable"},
		{"upstream bad scheme", []string{"proxy", "--upstream", "ftp://localhost:9000/?token=" + pw}, "xxxxx"},
		{"upstream unreachable", []string{"proxy", "--upstream", "http://" + closed + "/v1?api_key=" + pw}, "api_key=xxxxx"},
		{"otel-endpoint", []string{"proxy", "--upstream", up.url(), "--otel-endpoint", "http://collector:43x18/v1/traces?token=" + pw}, "xxxxx"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut strings.Builder
			code := run(t.Context(), tc.args, &out, &errOut, noEnv)
			if code == 0 {
				t.Fatalf("exit 0, want an error; stdout:\n%s", out.String())
			}
			all := out.String() + errOut.String()
			if strings.Contains(all, pw) || strings.Contains(all, strings.Replace(pw, "P", "%50", 1)) || !strings.Contains(all, tc.want) {
				t.Errorf("got %q, want %q and the secret hidden", all, tc.want)
			}
		})
	}
}

// TestProxyLogRedactsQuery: the proxy's log shows the upstream URL without
// the secret of its query, and the upstream still gets the query as given.
func TestProxyLogRedactsQuery(t *testing.T) {
	t.Parallel()
	const pw = "s3cr3tPW"
	up := newUpstream(t)
	p := startProxy(t, up.url()+"/?api_key="+pw, []string{"--data", t.TempDir()})
	if res := post(t, p.url("/orders"), "k", "x"); res.status != 201 {
		t.Errorf("POST: got %d, want 201", res.status)
	}
	p.terminate()
	p.wait()
	if logs := p.stderr.String(); strings.Contains(logs, pw) || !strings.Contains(logs, "api_key=xxxxx") {
		t.Errorf("the proxy's log:\n%s\nwant the upstream's api_key shown as xxxxx", logs)
	}
}
