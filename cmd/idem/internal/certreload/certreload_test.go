//go:build unix

package certreload

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log/slog"
	"math/big"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// writePair writes a self-signed certificate for name and its key.
func writePair(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		DNSNames: []string{name}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour)}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

func served(r *Reloader) string {
	c, _ := r.GetCertificate(&tls.ClientHelloInfo{})
	leaf, _ := x509.ParseCertificate(c.Certificate[0])
	return leaf.Subject.CommonName
}

// waitServed waits, up to 10s, for the reloader to serve name.
func waitServed(t *testing.T, r *Reloader, name string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for served(r) != name {
		if time.Now().After(deadline) {
			t.Fatalf("served %q after 10s, want %q", served(r), name)
		}
		time.Sleep(5 * time.Millisecond) // poll the certificate served
	}
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// TestReloadOnChange: new files are served once they change; a broken
// pair keeps the previous certificate.
func TestReloadOnChange(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writePair(t, dir, "one")
	r, err := New(certFile, keyFile, quiet())
	if err != nil {
		t.Fatal(err)
	}
	r.Watch(t.Context(), 10*time.Millisecond)
	writePair(t, dir, "two")
	waitServed(t, r, "two")
	if err := os.WriteFile(keyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := r.Reload(); err == nil {
		t.Fatal("Reload of a broken pair: got nil, want an error")
	}
	if got := served(r); got != "two" {
		t.Errorf("after a broken pair: served %q, want %q", got, "two")
	}
	if _, err := New(certFile, keyFile, quiet()); err == nil {
		t.Error("New with a broken pair: got nil, want an error")
	}
}

// TestReloadOnSIGHUP: SIGHUP reloads the files even when the change is not
// looked for (an interval of an hour).
func TestReloadOnSIGHUP(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := writePair(t, dir, "one")
	r, err := New(certFile, keyFile, quiet())
	if err != nil {
		t.Fatal(err)
	}
	r.Watch(t.Context(), time.Hour)
	writePair(t, dir, "two")
	if got := served(r); got != "one" {
		t.Fatalf("before SIGHUP: served %q, want %q", got, "one")
	}
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	waitServed(t, r, "two")
}

// TestMinVersion: the configuration refuses TLS 1.1.
func TestMinVersion(t *testing.T) {
	dir := t.TempDir()
	r, err := New(filepath.Join(dir, "none"), filepath.Join(dir, "none"), quiet())
	if err == nil || r != nil {
		t.Fatal("New of missing files: want an error")
	}
	certFile, keyFile := writePair(t, dir, "one")
	r, _ = New(certFile, keyFile, quiet())
	if v := r.Config().MinVersion; v != tls.VersionTLS12 {
		t.Errorf("MinVersion: got %x, want TLS 1.2", v)
	}
}
