package routesfile

import (
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/idemhttp"
	"github.com/idemgo/idem/keysource"
	"github.com/idemgo/idem/webhook"
)

// Webhook says how a route receives a provider's webhooks: `idem proxy
// --webhook` for the default route, a route's webhook field in the file.
// The names are the flags' or the fields' that give each part, for the
// errors.
type Webhook struct {
	Provider string // github, stripe, shopify or standard-webhooks; "" for none
	Name     string // what gives Provider: --webhook or webhook

	SecretFile     string // a file of the secrets, one a line
	SecretFileName string // what gives SecretFile
	SecretEnv      string // a variable that holds the secrets, one a line
	SecretEnvName  string // what gives SecretEnv
	// DefaultEnv makes SecretEnv the place the secrets are looked for when
	// SecretFile is empty, which may be empty or unset: then signatures
	// are not checked. Otherwise a SecretEnv that holds no secret is an
	// error, and so is a SecretEnv given with a SecretFile.
	DefaultEnv bool
	Getenv     func(string) string
}

// Receiver is what a Webhook gives a route.
type Receiver struct {
	// KeySource is the provider's delivery id; a key source the route
	// gives overrides it.
	KeySource keysource.Source
	// Verifier checks the signatures (a *webhook.Verifier); nil, not a
	// nil pointer, when no secret is given.
	Verifier idemhttp.Verifier
}

// Setup returns the key source and verifier of w, the zero Receiver if w
// names no provider. The secrets are read from SecretFile, else from
// SecretEnv; a file that holds no secret is an error.
func (w Webhook) Setup() (Receiver, error) {
	envGiven := w.SecretEnv != "" && !w.DefaultEnv
	if w.Provider == "" {
		switch {
		case w.SecretFile != "" && envGiven:
			return Receiver{}, fmt.Errorf("%s and %s need %s", w.SecretFileName, w.SecretEnvName, w.Name)
		case w.SecretFile != "":
			return Receiver{}, fmt.Errorf("%s needs %s", w.SecretFileName, w.Name)
		case envGiven:
			return Receiver{}, fmt.Errorf("%s needs %s", w.SecretEnvName, w.Name)
		}
		return Receiver{}, nil
	}
	src, err := webhook.KeySource(w.Provider)
	if err != nil {
		return Receiver{}, fmt.Errorf("invalid %s %q: want %s", w.Name, w.Provider, strings.Join(webhook.Providers, ", "))
	}
	secrets, err := w.secrets(envGiven)
	if err != nil || len(secrets) == 0 {
		return Receiver{KeySource: src}, err
	}
	v, err := webhook.New(w.Provider, secrets)
	if err != nil {
		return Receiver{}, fmt.Errorf("%s %s", w.Name, strings.TrimPrefix(err.Error(), "webhook: "))
	}
	return Receiver{KeySource: src, Verifier: v}, nil
}

// secrets reads the secrets of w; none if none is given.
func (w Webhook) secrets(envGiven bool) ([][]byte, error) {
	switch {
	case w.SecretFile != "" && envGiven:
		return nil, fmt.Errorf("give %s or %s, not both", w.SecretFileName, w.SecretEnvName)
	case w.SecretFile != "":
		b, err := os.ReadFile(w.SecretFile)
		if err != nil {
			return nil, fmt.Errorf("%s: %v", w.SecretFileName, cli.Cause(err))
		}
		secrets := parseSecrets(string(b))
		if len(secrets) == 0 {
			return nil, fmt.Errorf("%s %s holds no secret", w.SecretFileName, w.SecretFile)
		}
		return secrets, nil
	case w.SecretEnv != "":
		secrets := parseSecrets(w.Getenv(w.SecretEnv))
		if len(secrets) == 0 && envGiven {
			return nil, fmt.Errorf("%s: the variable %s is empty or not set", w.SecretEnvName, w.SecretEnv)
		}
		return secrets, nil
	}
	return nil, nil
}

// StorePolicy returns the store policy of the route, given the one its
// flag or field holds and whether that was given: a webhook without a
// secret stores only 2xx answers unless one was given, as a forged delivery
// that carries a real delivery's id could otherwise store its answer for
// it (docs/webhooks.md).
func (r Receiver) StorePolicy(policy string, given bool) string {
	if !given && !r.KeySource.IsZero() && r.Verifier == nil {
		return "only-2xx"
	}
	return policy
}

// Wait returns how long a retry of the route waits for the first request,
// given the wait its flag or field holds, whether that was given, and the
// route's lease: a webhook's wait is the lease unless one was given, so
// that a provider that redelivers while the first delivery runs gets its
// real answer, not a 409 it would count as a failure (docs/webhooks.md).
func (r Receiver) Wait(wait time.Duration, given bool, lease time.Duration) time.Duration {
	if !given && !r.KeySource.IsZero() {
		return lease
	}
	return wait
}

// parseSecrets returns the secrets of text, one per line (a webhook's
// secret file or variable).
func parseSecrets(text string) [][]byte {
	var secrets [][]byte
	for line := range strings.Lines(text) {
		if s := strings.TrimSpace(line); s != "" {
			secrets = append(secrets, []byte(s))
		}
	}
	return secrets
}
