package routesfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem/idemhttp"
)

func defaults() Defaults {
	return Defaults{
		Lease:   7 * time.Second,
		Methods: []string{"POST", "PATCH"},
		Policy: func(name string) idemhttp.Policy {
			if name == "only-2xx" {
				return idemhttp.StoreSuccessOnly
			}
			return nil
		},
		Getenv: func(k string) string {
			switch k {
			case "SECRET":
				return "s1\n\ns2\n"
			case "BLANK":
				return " \n"
			}
			return ""
		},
	}
}

func write(t *testing.T, text string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "routes.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestLoad(t *testing.T) {
	routes, err := Load(write(t, `routes:
  - path: /hooks/github
    webhook: github
    webhook_secret_env: SECRET
  - path: /hooks/stripe
    webhook: stripe
  - path: /events
    methods: [PUT]
    key_from: json:/id
    fingerprint: json:/a
    store_policy: only-2xx
    require_key: false
    lease: 1m
    wait: 0s
`), defaults())
	if err != nil || len(routes) != 3 {
		t.Fatalf("Load: %d routes, %v", len(routes), err)
	}
	gh, st, ev := routes[0], routes[1], routes[2]
	if gh.Lease != 7*time.Second || gh.Route.Wait != 7*time.Second || gh.Route.Verifier == nil || gh.Route.Policy != nil || gh.Route.KeySource.String() != "header:X-GitHub-Delivery" {
		t.Errorf("github route: %+v", gh)
	}
	// A webhook without a secret stores only 2xx answers.
	if st.Route.Verifier != nil || st.Route.Policy == nil {
		t.Errorf("stripe route without a secret: %+v", st)
	}
	if ev.Lease != time.Minute || ev.Route.Wait != -1 || !ev.Route.KeyOptional || ev.Route.KeySource.String() != "json:/id" || ev.Route.Policy == nil || ev.Route.Methods[0] != "PUT" {
		t.Errorf("events route: %+v", ev)
	}
	if routes, err := Load("", defaults()); routes != nil || err != nil {
		t.Errorf("Load without a file: %v, %v", routes, err)
	}
}

func TestLoadErrors(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, []byte("\n \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ text, want string }{
		{"routes:\n  - path: /a\n    key: x\n", ": line 3: field key not found (a route's fields are path, methods,"},
		{"route:\n  - path: /a\n", ": line 1: field route not found (the file has one field, routes)"},
		{"routes:\n  - path: /hooks\n  - path: /b\n  - path: /hooks/github\n", ": line 4: path /hooks/github overlaps /hooks for the same method (the route at line 2)"},
		{"routes: []\n", ": no routes (want routes: followed by a list of routes)"},
		{"routes:\n  - methods: [POST]\n", ": line 2: a route needs a path"},
		{"routes:\n  - path: /a\n    lease: 1us\n", `: line 2: invalid lease "1us"`},
		{"routes:\n  - path: /a\n    wait: -1s\n", `: line 2: invalid wait "-1s"`},
		{"routes:\n  - path: /a\n    webhook: nope\n", `: line 2: invalid webhook "nope"`},
		{"routes:\n  - path: /a\n    webhook: github\n    webhook_secret_env: NONE\n", ": line 2: webhook_secret_env: the variable NONE is empty or not set"},
		{"routes:\n  - path: /a\n    webhook: github\n    webhook_secret_file: f\n    webhook_secret_env: SECRET\n", ": line 2: give webhook_secret_file or webhook_secret_env, not both"},
		{"routes:\n  - path: /a\n    webhook_secret_env: SECRET\n", ": line 2: webhook_secret_env needs webhook"},
		{"routes:\n  - path: /a\n    webhook_secret_file: f\n", ": line 2: webhook_secret_file needs webhook"},
		{"routes:\n  - path: /a\n    webhook: github\n    webhook_secret_file: " + empty + "\n", ": line 2: webhook_secret_file " + empty + " holds no secret"},
		{"routes:\n  - path: /a\n    webhook: github\n    webhook_secret_env: BLANK\n", ": line 2: webhook_secret_env: the variable BLANK is empty or not set"},
		{"routes:\n  - path: /a\n    webhook: standard-webhooks\n    webhook_secret_env: SECRET\n", ": line 2: webhook standard-webhooks: secret 1: a Standard Webhooks secret starts with whsec_"},
		{"routes:\n  - path: /a\n    key_from: json:id\n", `: line 2: invalid key source "json:id"`},
		{"routes:\n  - path: /a\n    store_policy: bad\n", `: line 2: invalid store_policy "bad": want default, release-5xx or only-2xx`},
	} {
		path := write(t, tt.text)
		_, err := Load(path, defaults())
		if err == nil || !strings.Contains(err.Error(), "--routes "+path+tt.want) {
			t.Errorf("%q: got %v, want %q", tt.text, err, tt.want)
		}
	}
	d := defaults()
	d.KeyOptional = true
	if _, err := Load(write(t, "routes:\n  - path: /a\n    require_key: true\n"), d); err == nil || !strings.Contains(err.Error(), "require_key: true needs --require-key") {
		t.Errorf("require_key: true without --require-key: got %v", err)
	}
}
