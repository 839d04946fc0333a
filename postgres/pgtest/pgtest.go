// Package pgtest gives tests (of idem and of its users) a Postgres schema of their own on the server
// named by IDEM_POSTGRES_URL, dropped when the test ends.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultURL is the server the tests use when IDEM_POSTGRES_URL is unset.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"

// startHint says how to start the local server the tests expect.
const startHint = "start it with: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"

// BaseURL returns IDEM_POSTGRES_URL, or DefaultURL.
func BaseURL() string {
	if u := os.Getenv("IDEM_POSTGRES_URL"); u != "" {
		return u
	}
	return DefaultURL
}

// Schema creates a schema with a random name and returns a connection URL
// whose search_path is that schema; the schema and everything in it are
// dropped when t ends. It fails t when Postgres does not answer.
func Schema(t testing.TB) string {
	t.Helper()
	base := BaseURL()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, base)
	if err != nil {
		t.Fatalf("pgtest: Postgres does not answer at %s (%v); %s", base, err, startHint)
	}
	defer conn.Close(context.Background())
	var b [6]byte
	rand.Read(b[:])
	name := "idem_test_" + hex.EncodeToString(b[:])
	if _, err := conn.Exec(ctx, "CREATE SCHEMA "+name); err != nil {
		t.Fatalf("pgtest: create schema: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, base)
		if err != nil {
			t.Errorf("pgtest: drop schema %s: %v", name, err)
			return
		}
		defer c.Close(context.Background())
		if _, err := c.Exec(ctx, "DROP SCHEMA "+name+" CASCADE"); err != nil {
			t.Errorf("pgtest: drop schema %s: %v", name, err)
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	q := u.Query()
	q.Set("search_path", name)
	u.RawQuery = q.Encode()
	return u.String()
}

// Pool returns a pool on a new schema (see Schema), closed when t ends.
func Pool(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	u := Schema(t)
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool, u
}
