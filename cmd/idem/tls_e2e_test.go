package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// writeCert writes a self-signed certificate for 127.0.0.1 named name,
// and its key, in dir.
func writeCert(t *testing.T, dir, name string) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	// The key first: the proxy may look between the two writes, and a
	// pair that does not match is not served.
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// servedName returns the common name of the certificate addr serves,
// trusting it.
func servedName(addr string) (string, error) {
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) // the name is what is looked at
	if err != nil {
		return "", err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

// TestProxyTLS: with --tls-cert/--tls-key the proxy serves HTTPS, HTTP/2
// by ALPN, refuses TLS 1.1, deduplicates as over HTTP/1.1, speaks HTTP/2 to
// an https upstream, and serves a new certificate once its files change.
func TestProxyTLS(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	runs, protos := map[string]int{}, map[int]int{}
	up := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		runs[r.Header.Get("Idempotency-Key")]++
		protos[r.ProtoMajor]++
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, "created")
	}))
	up.EnableHTTP2 = true
	up.StartTLS()
	t.Cleanup(up.Close)
	dir := t.TempDir()
	ca := filepath.Join(dir, "upstream-ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: up.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	certDir := filepath.Join(dir, "tls")
	os.Mkdir(certDir, 0o700)
	certFile, keyFile := writeCert(t, certDir, "one")
	addr, admin := freeAddr(t), freeAddr(t)
	launchProxyEnv(t, []string{"SSL_CERT_FILE=" + ca},
		[]string{"proxy", "--listen", addr, "--admin-listen", admin, "--upstream", up.URL, "--data", filepath.Join(dir, "data"),
			"--tls-cert", certFile, "--tls-key", keyFile}, addr, admin)

	pemCert, _ := os.ReadFile(certFile)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemCert)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots}, ForceAttemptHTTP2: true}}
	for i := range 2 {
		req, _ := http.NewRequest("POST", "https://"+addr+"/payments", strings.NewReader("x"))
		req.Header.Set("Idempotency-Key", "k1")
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 201 || string(body) != "created" || res.ProtoMajor != 2 {
			t.Fatalf("request %d: %s %s %q, want HTTP/2 201 created", i, res.Proto, res.Status, body)
		}
		if replayed := res.Header.Get("Idempotent-Replayed") == "true"; replayed != (i == 1) {
			t.Errorf("request %d: replayed %v", i, replayed)
		}
	}
	mu.Lock()
	if runs["k1"] != 1 || protos[2] != 1 {
		t.Errorf("upstream: ran %d times, %d over HTTP/2; want 1 and 1", runs["k1"], protos[2])
	}
	mu.Unlock()
	if conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, MaxVersion: tls.VersionTLS11}); err == nil {
		conn.Close()
		t.Error("a TLS 1.1 client was served")
	}

	writeCert(t, certDir, "two")
	deadline := time.Now().Add(10 * time.Second)
	for {
		name, err := servedName(addr)
		if err == nil && name == "two" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("served %q, %v 10s after the files changed; want the new certificate", name, err)
		}
		time.Sleep(50 * time.Millisecond) // poll the certificate served
	}
}
