package routesfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// proxyWebhook is the Webhook of `idem proxy --webhook`: the secrets in
// --webhook-secret-file, else in a variable that may be unset.
func proxyWebhook(provider, file string, env map[string]string) Webhook {
	return Webhook{
		Provider: provider, Name: "--webhook",
		SecretFile: file, SecretFileName: "--webhook-secret-file",
		SecretEnv: "IDEM_WEBHOOK_SECRET", DefaultEnv: true,
		Getenv: func(k string) string { return env[k] },
	}
}

func TestWebhookSetup(t *testing.T) {
	dir := t.TempDir()
	secrets := filepath.Join(dir, "secrets")
	if err := os.WriteFile(secrets, []byte("old\nnew\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	empty := filepath.Join(dir, "empty")
	if err := os.WriteFile(empty, []byte("\n  \n"), 0o600); err != nil {
		t.Fatal(err)
	}

	// No provider: nothing to set, and no store policy of its own.
	rc, err := proxyWebhook("", "", map[string]string{"IDEM_WEBHOOK_SECRET": "s"}).Setup()
	if err != nil || !rc.KeySource.IsZero() || rc.Verifier != nil || rc.StorePolicy("default", false) != "default" {
		t.Errorf("no provider: %+v, %v", rc, err)
	}
	// The default variable unset: signatures are not checked, and only 2xx
	// answers are stored unless a policy is given.
	rc, err = proxyWebhook("github", "", nil).Setup()
	if err != nil || rc.KeySource.String() != "header:X-GitHub-Delivery" || rc.Verifier != nil {
		t.Fatalf("no secret: %+v, %v", rc, err)
	}
	if p := rc.StorePolicy("default", false); p != "only-2xx" {
		t.Errorf("no secret, no policy given: got %q, want only-2xx", p)
	}
	if p := rc.StorePolicy("release-5xx", true); p != "release-5xx" {
		t.Errorf("no secret, release-5xx given: got %q", p)
	}
	// A secret in the variable or in the file (which wins).
	for _, w := range []Webhook{
		proxyWebhook("github", "", map[string]string{"IDEM_WEBHOOK_SECRET": "s\n"}),
		proxyWebhook("github", secrets, map[string]string{"IDEM_WEBHOOK_SECRET": "s"}),
	} {
		rc, err := w.Setup()
		if err != nil || rc.Verifier == nil || rc.StorePolicy("default", false) != "default" {
			t.Errorf("secret (file %q): %+v, %v", w.SecretFile, rc, err)
		}
	}

	for _, tt := range []struct {
		w    Webhook
		want string
	}{
		{proxyWebhook("gitlab", "", nil), `invalid --webhook "gitlab": want github, stripe, shopify, standard-webhooks`},
		{proxyWebhook("", secrets, nil), "--webhook-secret-file needs --webhook"},
		{proxyWebhook("github", filepath.Join(dir, "none"), nil), "--webhook-secret-file: "},
		{proxyWebhook("github", empty, nil), "--webhook-secret-file " + empty + " holds no secret"},
		{proxyWebhook("standard-webhooks", "", map[string]string{"IDEM_WEBHOOK_SECRET": "plain"}), "--webhook standard-webhooks: secret 1: a Standard Webhooks secret starts with whsec_"},
	} {
		if _, err := tt.w.Setup(); err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%+v: got %v, want %q", tt.w, err, tt.want)
		}
	}
}

// TestReceiverWait: a webhook's wait is the lease unless one was given,
// for --webhook and a route's webhook alike; without a webhook the wait
// stays as given.
func TestReceiverWait(t *testing.T) {
	gh, err := Webhook{Provider: "github", Name: "webhook", Getenv: func(string) string { return "" }}.Setup()
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		rc    Receiver
		wait  time.Duration
		given bool
		want  time.Duration
	}{
		{"webhook, no wait given", gh, 0, false, 7 * time.Second},
		{"webhook, wait given", gh, -1, true, -1},
		{"no webhook", Receiver{}, 0, false, 0},
	} {
		if got := tt.rc.Wait(tt.wait, tt.given, 7*time.Second); got != tt.want {
			t.Errorf("%s: got %v, want %v", tt.name, got, tt.want)
		}
	}
}
