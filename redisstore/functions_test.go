package redisstore_test

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/idemgo/idem/storekit"
	"github.com/idemgo/idem/testkit/redistest"
)

// foreignLibrary is another application's library: idem must leave it as
// it is.
const foreignLibrary = "#!lua name=otherapp\nredis.register_function('otherapp_ping', function() return 'pong' end)"

// TestFunctionFlush flushes the server's functions between calls, on a
// server: every call loads idem's library again and succeeds, with and
// without WAIT. Then another application's library is loaded: idem's own
// loads leave it as it is.
func TestFunctionFlush(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t, "--appendonly", "no")
	redistest.Start(t, "--replicaof", "127.0.0.1", strings.TrimPrefix(srv.Addr(), "127.0.0.1:"))
	waitReplica(t, srv)
	flush := func(t *testing.T) {
		t.Helper()
		if _, err := srv.Command("FUNCTION", "FLUSH"); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range clients(t, srv, nil) {
		for _, durable := range []bool{false, true} {
			name := c.name
			opts := append([]redisstore.Option{redisstore.WithFunctions()}, testEffects...)
			if durable {
				name += "/wait"
				opts = append(opts, redisstore.WithWait(1, 5*time.Second))
			}
			t.Run(name, func(t *testing.T) {
				s := c.newStore(t, opts...)
				for i := range 3 {
					key := idem.Key{Scope: name, ID: string(rune('a' + i))}
					flush(t)
					a := acquire(t, s, key.Digest())
					if a.Outcome != storekit.Acquired {
						t.Fatalf("Acquire after FUNCTION FLUSH: got %v, want Acquired", a.Outcome)
					}
					flush(t)
					if err := s.CompleteEffect(t.Context(), key.Digest(), a.Lease, emptyResult, time.Hour, count(t, s, key)); err != nil {
						t.Fatalf("CompleteEffect after FUNCTION FLUSH: %v", err)
					}
					flush(t)
					if rec, err := s.Get(t.Context(), key.Digest()); err != nil || rec.State != storekit.StateCompleted {
						t.Fatalf("Get after FUNCTION FLUSH: got %+v, %v", rec, err)
					}
					flush(t)
					// A batch on a server without the library.
					keys := []string{idem.Key{Scope: name, ID: "batch1-" + key.ID}.Digest(), idem.Key{Scope: name, ID: "batch2-" + key.ID}.Digest()}
					req := storekit.AcquireRequest{Fingerprint: "fp", Owner: "o", Lease: time.Minute, Retention: time.Hour}
					if !durable {
						acqs, errs := s.AcquireBatch(t.Context(), keys, []storekit.AcquireRequest{req, req})
						for i := range keys {
							if errs[i] != nil || acqs[i].Outcome != storekit.Acquired {
								t.Fatalf("AcquireBatch after FUNCTION FLUSH: got %+v, %v", acqs[i], errs[i])
							}
						}
					}
				}
			})
		}
	}
	// The other application's library survives idem's loads.
	if _, err := srv.Command("FUNCTION", "LOAD", foreignLibrary); err != nil {
		t.Fatal(err)
	}
	s := clients(t, srv, nil)[0].newStore(t, redisstore.WithFunctions())
	if _, err := s.Get(t.Context(), idem.Key{ID: "x"}.Digest()); err != storekit.ErrNotFound {
		t.Fatalf("Get: got %v, want ErrNotFound", err)
	}
	libs, err := srv.Command("FUNCTION", "LIST", "LIBRARYNAME", "otherapp")
	if err != nil || !strings.Contains(libs, "otherapp_ping") {
		t.Fatalf("the other library: got %q, %v, want it kept", libs, err)
	}
}

// TestFunctionsLibrary checks the library's name, that it is loaded on
// every primary of a Cluster at first use, that LoadedLibraries reports it,
// and that a restart with AOF keeps it (no FUNCTION LOAD needed after).
func TestFunctionsLibrary(t *testing.T) {
	t.Parallel()
	if name := redisstore.LibraryName(); !regexp.MustCompile(`^idem_[0-9a-f]{12}$`).MatchString(name) {
		t.Fatalf("LibraryName: got %q, want idem_<12 hex digits>", name)
	}
	t.Run("cluster", func(t *testing.T) {
		t.Parallel()
		cluster := redistest.StartCluster(t, 3)
		for _, c := range clients(t, nil, cluster) {
			s := c.newStore(t, append([]redisstore.Option{redisstore.WithFunctions()}, testEffects...)...)
			if _, err := s.Get(t.Context(), idem.Key{ID: c.name}.Digest()); err != storekit.ErrNotFound {
				t.Fatalf("%s: Get: got %v, want ErrNotFound", c.name, err)
			}
			for _, n := range cluster.Nodes() {
				libs, err := n.Command("FUNCTION", "LIST", "LIBRARYNAME", redisstore.LibraryName())
				if err != nil || !strings.Contains(libs, redisstore.LibraryName()+"_get") {
					t.Fatalf("%s: node %s: got %q, %v, want the library", c.name, n.Addr(), libs, err)
				}
			}
			libs, err := s.LoadedLibraries(t.Context())
			if err != nil || !slices.Contains(libs, redisstore.LibraryName()) {
				t.Fatalf("%s: LoadedLibraries: got %v, %v", c.name, libs, err)
			}
		}
	})
	t.Run("restart", func(t *testing.T) {
		t.Parallel()
		srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
		c := clients(t, srv, nil)[0]
		s := c.newStore(t, append([]redisstore.Option{redisstore.WithFunctions()}, testEffects...)...)
		key := idem.Key{ID: "kept"}
		a := acquire(t, s, key.Digest())
		if err := s.CompleteEffect(t.Context(), key.Digest(), a.Lease, emptyResult, time.Hour, count(t, s, key)); err != nil {
			t.Fatal(err)
		}
		before, err := s.LoadedLibraries(t.Context())
		if err != nil || len(before) != 2 {
			t.Fatalf("LoadedLibraries: got %v, %v, want idem's and the effects' libraries", before, err)
		}
		srv.Restart(t)
		after, err := untilNoError(func() ([]string, error) { return s.LoadedLibraries(t.Context()) })
		if err != nil || !slices.Equal(after, before) {
			t.Fatalf("after the restart: got %v, %v, want %v", after, err, before)
		}
		if rec, err := s.Get(t.Context(), key.Digest()); err != nil || rec.State != storekit.StateCompleted {
			t.Fatalf("Get after the restart: got %+v, %v", rec, err)
		}
	})
}

// TestForeignLibraryOfIdemsName loads, under the name of idem's library,
// a library with other code, on a server and on every primary of a
// Cluster: CheckLibrary reports it, every call of the store (whose
// functions that library lacks) still succeeds, as the store replaces it
// with its own, and CheckLibrary then reports it loaded.
func TestForeignLibraryOfIdemsName(t *testing.T) {
	t.Parallel()
	standalone := redistest.Start(t)
	cluster := redistest.StartCluster(t, 3)
	name := redisstore.LibraryName()
	foreign := "#!lua name=" + name + "\nredis.register_function('" + name + "_other', function() return 1 end)"
	for _, c := range clients(t, standalone, cluster) {
		t.Run(c.name, func(t *testing.T) {
			nodes := []*redistest.Server{standalone}
			if strings.HasPrefix(c.name, "cluster") {
				nodes = cluster.Nodes()
			}
			for _, n := range nodes {
				if _, err := n.Command("FUNCTION", "LOAD", "REPLACE", foreign); err != nil {
					t.Fatal(err)
				}
				st, err := redisstore.CheckLibrary(t.Context(), goRedisClient(t, n.Addr()))
				if err != nil || st != redisstore.LibraryForeign {
					t.Fatalf("CheckLibrary on %s: got %v, %v, want LibraryForeign", n.Addr(), st, err)
				}
			}
			s := c.newStore(t, redisstore.WithFunctions())
			for i := range 4 {
				key := idem.Key{Scope: c.name, ID: strconv.Itoa(i)}.Digest()
				if _, err := s.Get(t.Context(), key); err != storekit.ErrNotFound {
					t.Fatalf("Get: got %v, want ErrNotFound", err)
				}
				if a := acquire(t, s, key); a.Outcome != storekit.Acquired {
					t.Fatalf("Acquire: got %v, want Acquired", a.Outcome)
				}
			}
			for _, n := range nodes {
				st, err := redisstore.CheckLibrary(t.Context(), goRedisClient(t, n.Addr()))
				if err != nil || st != redisstore.LibraryLoaded {
					t.Fatalf("CheckLibrary on %s after the calls: got %v, %v, want LibraryLoaded", n.Addr(), st, err)
				}
			}
		})
	}
}
