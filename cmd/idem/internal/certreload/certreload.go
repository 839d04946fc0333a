// Package certreload serves a TLS certificate read from a certificate
// file and a key file, and reads them again on SIGHUP and when they
// change, so that a renewed certificate is served without a restart.
package certreload

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"
)

// Reloader holds the certificate of a pair of files. Its methods are safe
// for concurrent use.
type Reloader struct {
	certFile, keyFile string
	log               *slog.Logger
	cert              atomic.Pointer[tls.Certificate]
	stamp             atomic.Value // stamp of the files last read
}

// stamp is what tells that a file changed: its size and modification time.
type stamp struct {
	certSize, keySize int64
	certMod, keyMod   time.Time
}

func statFiles(certFile, keyFile string) (stamp, error) {
	c, err := os.Stat(certFile)
	if err != nil {
		return stamp{}, err
	}
	k, err := os.Stat(keyFile)
	if err != nil {
		return stamp{}, err
	}
	return stamp{certSize: c.Size(), keySize: k.Size(), certMod: c.ModTime(), keyMod: k.ModTime()}, nil
}

// New reads the pair; it returns an error if it cannot be read or does
// not hold a certificate and its key.
func New(certFile, keyFile string, log *slog.Logger) (*Reloader, error) {
	r := &Reloader{certFile: certFile, keyFile: keyFile, log: log}
	if err := r.Reload(); err != nil {
		return nil, err
	}
	return r, nil
}

// Reload reads the pair again. On an error the certificate served so far
// stays.
func (r *Reloader) Reload() error {
	st, _ := statFiles(r.certFile, r.keyFile)
	cert, err := tls.LoadX509KeyPair(r.certFile, r.keyFile)
	if err != nil {
		return fmt.Errorf("reading the TLS certificate %s and key %s: %w", r.certFile, r.keyFile, err)
	}
	r.cert.Store(&cert)
	r.stamp.Store(st)
	return nil
}

// GetCertificate is for tls.Config.GetCertificate.
func (r *Reloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return r.cert.Load(), nil
}

// Config returns a server configuration that serves the certificate, with
// TLS 1.2 at least.
func (r *Reloader) Config() *tls.Config {
	return &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: r.GetCertificate}
}

// Watch reloads the pair on SIGHUP and when the files' size or
// modification time changes (looked at every interval), until ctx is
// done; it logs each reload and each failure. SIGHUP is caught from the
// time Watch returns: the watching goes on in a goroutine of its own.
func (r *Reloader) Watch(ctx context.Context, interval time.Duration) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	go r.watch(ctx, hup, interval)
}

func (r *Reloader) watch(ctx context.Context, hup chan os.Signal, interval time.Duration) {
	defer signal.Stop(hup)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		why := ""
		select {
		case <-ctx.Done():
			return
		case <-hup:
			why = "SIGHUP"
		case <-t.C:
			st, err := statFiles(r.certFile, r.keyFile)
			if err != nil || st == r.stamp.Load().(stamp) {
				continue
			}
			why = "the files changed"
		}
		if err := r.Reload(); err != nil {
			r.log.Error("TLS certificate not reloaded; serving the previous one", "reason", why, "error", err)
			continue
		}
		r.log.Info("TLS certificate reloaded", "reason", why, "cert", r.certFile)
	}
}
