package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/idemproxy"
	"github.com/idemgo/idem/keysource"
	"github.com/idemgo/idem/webhook"
)

// routesFile is the file of --routes, YAML or JSON:
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

// loadedRoute is a route of the file, ready but for its Executor, which
// build makes for its lease.
type loadedRoute struct {
	route idemproxy.Route
	lease time.Duration
}

// loadRoutes reads --routes: unknown fields, bad values, overlapping
// routes and paths that match no request are usage errors that name the
// file and the line.
func (c *proxyConfig) loadRoutes(getenv func(string) string) ([]loadedRoute, error) {
	if c.routesPath == "" {
		return nil, nil
	}
	data, err := os.ReadFile(c.routesPath)
	if err != nil {
		return nil, cli.Usagef("--routes: %v", cli.Cause(err))
	}
	fail := func(line int, format string, args ...any) error {
		return cli.Usagef("--routes %s: line %d: %s", c.routesPath, line, fmt.Sprintf(format, args...))
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f routesFile
	if err := dec.Decode(&f); err != nil {
		msg := strings.TrimPrefix(err.Error(), "yaml: ")
		msg = strings.ReplaceAll(msg, "unmarshal errors:\n  ", "")
		msg = strings.ReplaceAll(msg, "in type main.routeSpec", "(a route's fields are "+routeFields+")")
		msg = strings.ReplaceAll(msg, "in type main.routesFile", "(the file has one field, routes)")
		return nil, cli.Usagef("--routes %s: %s", c.routesPath, msg)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, cli.Usagef("--routes %s: %v", c.routesPath, err)
	}
	lines := routeLines(&doc)
	if len(f.Routes) == 0 {
		return nil, cli.Usagef("--routes %s: no routes (want routes: followed by a list of routes)", c.routesPath)
	}
	out := make([]loadedRoute, len(f.Routes))
	routes := make([]idemproxy.Route, len(f.Routes))
	for i, s := range f.Routes {
		line := 0
		if i < len(lines) {
			line = lines[i]
		}
		lr, err := c.loadRoute(s, getenv)
		if err != nil {
			return nil, fail(line, "%v", err)
		}
		out[i], routes[i] = lr, lr.route
	}
	if err := idemproxy.CheckRoutes(routes, c.proxy.Methods); err != nil {
		var re *idemproxy.RouteError
		if errors.As(err, &re) && re.Index < len(lines) {
			if re.Other >= 0 && re.Other < len(lines) {
				return nil, fail(lines[re.Index], "%s (the route at line %d)", re.Reason, lines[re.Other])
			}
			return nil, fail(lines[re.Index], "%s", re.Reason)
		}
		return nil, cli.Usagef("--routes %s: %v", c.routesPath, err)
	}
	return out, nil
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

// loadRoute turns one route of the file into a Route, the flags giving
// what it leaves out.
func (c *proxyConfig) loadRoute(s routeSpec, getenv func(string) string) (loadedRoute, error) {
	lr := loadedRoute{lease: c.lease}
	rt := &lr.route
	rt.PathPrefix, rt.Methods = s.Path, s.Methods
	if s.Path == "" {
		return lr, errors.New("a route needs a path")
	}
	if s.Lease != "" {
		d, err := time.ParseDuration(s.Lease)
		if err != nil || d < time.Millisecond {
			return lr, fmt.Errorf("invalid lease %q: want a duration of 1ms or more, e.g. 30s", s.Lease)
		}
		lr.lease = d
	}
	if s.Wait != "" {
		d, err := time.ParseDuration(s.Wait)
		if err != nil || d < 0 {
			return lr, fmt.Errorf("invalid wait %q: want a duration, e.g. 30s (0: answer 409 at once)", s.Wait)
		}
		rt.Wait = d
		if d == 0 {
			rt.Wait = -1
		}
	}
	if s.RequireKey != nil {
		if *s.RequireKey && c.proxy.KeyOptional {
			return lr, errors.New("require_key: true needs --require-key (the default route passes requests without a key through)")
		}
		rt.KeyOptional = !*s.RequireKey
	}
	policy := s.StorePolicy
	if s.Webhook != "" {
		src, err := webhook.KeySource(s.Webhook)
		if err != nil {
			return lr, fmt.Errorf("invalid webhook %q: want %s", s.Webhook, strings.Join(webhook.Providers, ", "))
		}
		rt.KeySource = src
		if s.Wait == "" {
			rt.Wait = lr.lease
		}
		var text string
		switch {
		case s.WebhookSecretFile != "" && s.WebhookSecretEnv != "":
			return lr, errors.New("give webhook_secret_file or webhook_secret_env, not both")
		case s.WebhookSecretFile != "":
			b, err := os.ReadFile(s.WebhookSecretFile)
			if err != nil {
				return lr, fmt.Errorf("webhook_secret_file: %v", cli.Cause(err))
			}
			text = string(b)
		case s.WebhookSecretEnv != "":
			text = getenv(s.WebhookSecretEnv)
			if text == "" {
				return lr, fmt.Errorf("webhook_secret_env: the variable %s is empty or not set", s.WebhookSecretEnv)
			}
		}
		if secrets := parseSecrets(text); len(secrets) > 0 {
			v, err := webhook.New(s.Webhook, secrets)
			if err != nil {
				return lr, errors.New(strings.TrimPrefix(err.Error(), "webhook: "))
			}
			rt.Verifier = v
		} else if policy == "" {
			policy = "only-2xx"
		}
	} else if s.WebhookSecretFile != "" || s.WebhookSecretEnv != "" {
		return lr, errors.New("webhook_secret_file and webhook_secret_env need webhook")
	}
	if s.KeyFrom != "" {
		src, err := keysource.Parse(s.KeyFrom)
		if err != nil {
			return lr, errors.New(strings.TrimPrefix(err.Error(), "keysource: "))
		}
		rt.KeySource = src
	}
	if s.Fingerprint != "" {
		fp, err := keysource.ParseFingerprint(s.Fingerprint)
		if err != nil {
			return lr, errors.New(strings.TrimPrefix(err.Error(), "keysource: "))
		}
		rt.Fingerprint = fp
	}
	if policy != "" {
		for _, p := range storePolicies {
			if p.name == policy {
				rt.Policy = p.policy
			}
		}
		if rt.Policy == nil {
			return lr, fmt.Errorf("invalid store_policy %q: want default, release-5xx or only-2xx", policy)
		}
	}
	return lr, nil
}

// parseSecrets returns the secrets of text, one per line.
func parseSecrets(text string) [][]byte {
	var secrets [][]byte
	for line := range strings.Lines(text) {
		if s := strings.TrimSpace(line); s != "" {
			secrets = append(secrets, []byte(s))
		}
	}
	return secrets
}
