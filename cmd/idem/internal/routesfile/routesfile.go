// Package routesfile reads the file of `idem proxy --routes` (YAML or
// JSON) into idemproxy routes, the proxy's flags giving what a route
// leaves out (docs/webhooks.md):
//
//	routes:
//	  - path: /hooks/github
//	    webhook: github
//	    webhook_secret_env: GITHUB_WEBHOOK_SECRET
//	  - path: /hooks/stripe
//	    methods: [POST]
//	    key_from: json:/id
//	    fingerprint: json:/type,/data
//	    store_policy: only-2xx
//	    require_key: false
//	    lease: 1m
//
// Unknown fields, bad values, overlapping routes and paths that match no
// request are usage errors that name the file and the line.
package routesfile

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/idemproxy"
	"github.com/idemgo/idem/keysource"
)

// routesFile is the file.
type routesFile struct {
	Routes []routeSpec `yaml:"routes"`
}

// routeSpec is one route of the file; a field left out takes the flag's
// value (the default route).
type routeSpec struct {
	Path              string   `yaml:"path"`
	Methods           []string `yaml:"methods"`
	KeyFrom           string   `yaml:"key_from"`
	Fingerprint       string   `yaml:"fingerprint"`
	StorePolicy       string   `yaml:"store_policy"`
	Lease             string   `yaml:"lease"`
	Wait              string   `yaml:"wait"`
	RequireKey        *bool    `yaml:"require_key"`
	Webhook           string   `yaml:"webhook"`
	WebhookSecretFile string   `yaml:"webhook_secret_file"`
	WebhookSecretEnv  string   `yaml:"webhook_secret_env"`
}

const routeFields = "path, methods, key_from, fingerprint, require_key, store_policy, lease, wait, webhook, webhook_secret_file, webhook_secret_env"

// Defaults are the flags of the default route, which give what a route of
// the file leaves out.
type Defaults struct {
	Lease       time.Duration // --lease
	KeyOptional bool          // the default route passes requests without a key through
	Methods     []string      // --methods
	// Policy returns the policy of a --store-policy name, nil if none.
	Policy func(name string) idemhttp.Policy
	// Getenv reads the variables that webhook_secret_env names.
	Getenv func(string) string
}

// Route is a route of the file, ready but for its Executor, which the
// command makes for its Lease.
type Route struct {
	Route idemproxy.Route
	Lease time.Duration
}

// Load reads the routes file at path; none if path is empty.
func Load(path string, d Defaults) ([]Route, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, cli.Usagef("--routes: %v", cli.Cause(err))
	}
	f, lines, err := decode(path, data)
	if err != nil {
		return nil, err
	}
	fail := func(line int, format string, args ...any) error {
		return cli.Usagef("--routes %s: line %d: %s", path, line, fmt.Sprintf(format, args...))
	}
	out := make([]Route, len(f.Routes))
	routes := make([]idemproxy.Route, len(f.Routes))
	for i, s := range f.Routes {
		line := 0
		if i < len(lines) {
			line = lines[i]
		}
		r, err := d.route(s)
		if err != nil {
			return nil, fail(line, "%v", err)
		}
		out[i], routes[i] = r, r.Route
	}
	if err := idemproxy.CheckRoutes(routes, d.Methods); err != nil {
		var re *idemproxy.RouteError
		if errors.As(err, &re) && re.Index < len(lines) {
			if re.Other >= 0 && re.Other < len(lines) {
				return nil, fail(lines[re.Index], "%s (the route at line %d)", re.Reason, lines[re.Other])
			}
			return nil, fail(lines[re.Index], "%s", re.Reason)
		}
		return nil, cli.Usagef("--routes %s: %v", path, err)
	}
	return out, nil
}

// decode decodes the file, and returns the line of each of its routes.
func decode(path string, data []byte) (*routesFile, []int, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f routesFile
	if err := dec.Decode(&f); err != nil {
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		msg = strings.ReplaceAll(msg, "unmarshal errors:\n  ", "")
		msg = strings.ReplaceAll(msg, "in type routesfile.routeSpec", "(a route's fields are "+routeFields+")")
		msg = strings.ReplaceAll(msg, "in type routesfile.routesFile", "(the file has one field, routes)")
		return nil, nil, cli.Usagef("--routes %s: %s", path, msg)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, nil, cli.Usagef("--routes %s: %v", path, err)
	}
	lines := routeLines(&doc)
	if len(f.Routes) == 0 {
		return nil, nil, cli.Usagef("--routes %s: no routes (want routes: followed by a list of routes)", path)
	}
	return &f, lines, nil
}

// routeLines returns the line of each item of the routes list.
func routeLines(doc *yaml.Node) []int {
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil
	}
	m := doc.Content[0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == "routes" {
			var lines []int
			for _, item := range m.Content[i+1].Content {
				lines = append(lines, item.Line)
			}
			return lines
		}
	}
	return nil
}

// route turns one route of the file into a Route, d giving what it leaves
// out. Its steps run in order: the webhook's key source and wait give way
// to key_from and wait, and a webhook without a secret stores only 2xx
// unless store_policy says otherwise.
func (d *Defaults) route(s routeSpec) (Route, error) {
	r := Route{Lease: d.Lease}
	r.Route.PathPrefix, r.Route.Methods = s.Path, s.Methods
	if s.Path == "" {
		return r, errors.New("a route needs a path")
	}
	for _, step := range []func(*Route, *routeSpec) error{
		parseLease, parseWait, d.requireKey, d.webhook, parseKeys, d.policy,
	} {
		if err := step(&r, &s); err != nil {
			return r, err
		}
	}
	return r, nil
}

func parseLease(r *Route, s *routeSpec) error {
	if s.Lease == "" {
		return nil
	}
	d, err := time.ParseDuration(s.Lease)
	if err != nil || d < time.Millisecond {
		return fmt.Errorf("invalid lease %q: want a duration of 1ms or more, e.g. 30s", s.Lease)
	}
	r.Lease = d
	return nil
}

func parseWait(r *Route, s *routeSpec) error {
	if s.Wait == "" {
		return nil
	}
	d, err := time.ParseDuration(s.Wait)
	if err != nil || d < 0 {
		return fmt.Errorf("invalid wait %q: want a duration, e.g. 30s (0: answer 409 at once)", s.Wait)
	}
	r.Route.Wait = d
	if d == 0 {
		r.Route.Wait = -1
	}
	return nil
}

func (d *Defaults) requireKey(r *Route, s *routeSpec) error {
	if s.RequireKey == nil {
		return nil
	}
	if *s.RequireKey && d.KeyOptional {
		return errors.New("require_key: true needs --require-key (the default route passes requests without a key through)")
	}
	r.Route.KeyOptional = !*s.RequireKey
	return nil
}

// webhook sets the key source, wait and verifier of webhook; without a
// secret, the store policy becomes only-2xx unless store_policy is given.
func (d *Defaults) webhook(r *Route, s *routeSpec) error {
	rc, err := Webhook{
		Provider: s.Webhook, Name: "webhook",
		SecretFile: s.WebhookSecretFile, SecretFileName: "webhook_secret_file",
		SecretEnv: s.WebhookSecretEnv, SecretEnvName: "webhook_secret_env",
		Getenv: d.Getenv,
	}.Setup()
	if err != nil || s.Webhook == "" {
		return err
	}
	r.Route.KeySource, r.Route.Verifier = rc.KeySource, rc.Verifier
	r.Route.Wait = rc.Wait(r.Route.Wait, s.Wait != "", r.Lease)
	s.StorePolicy = rc.StorePolicy(s.StorePolicy, s.StorePolicy != "")
	return nil
}

// parseKeys sets key_from and fingerprint.
func parseKeys(r *Route, s *routeSpec) error {
	if s.KeyFrom != "" {
		src, err := keysource.Parse(s.KeyFrom)
		if err != nil {
			return errors.New(strings.TrimPrefix(err.Error(), "keysource: "))
		}
		r.Route.KeySource = src
	}
	if s.Fingerprint != "" {
		fp, err := keysource.ParseFingerprint(s.Fingerprint)
		if err != nil {
			return errors.New(strings.TrimPrefix(err.Error(), "keysource: "))
		}
		r.Route.Fingerprint = fp
	}
	return nil
}

func (d *Defaults) policy(r *Route, s *routeSpec) error {
	if s.StorePolicy == "" {
		return nil
	}
	if r.Route.Policy = d.Policy(s.StorePolicy); r.Route.Policy == nil {
		return fmt.Errorf("invalid store_policy %q: want default, release-5xx or only-2xx", s.StorePolicy)
	}
	return nil
}
