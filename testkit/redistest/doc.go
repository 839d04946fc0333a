// Package redistest starts real, throwaway redis-server processes for tests:
// single servers that a test can kill, restart, pause and resume, and small
// Redis Clusters built with redis-cli --cluster create.
//
// Every server listens on a free loopback port, keeps its files (log, AOF,
// nodes.conf) in its own t.TempDir, and is killed by its own PID in
// t.Cleanup. Servers are independent of each other, so tests that start them
// may run in parallel. When a test fails, the cleanup logs the last lines of
// each of its servers' logs.
//
// redis-server and redis-cli must be on PATH. If they are missing, Start and
// StartCluster fail the test (they never skip it: integration tests must not
// vanish silently in CI); the message names the install command.
//
// A test uses it like this:
//
//	func TestRestart(t *testing.T) {
//		srv := redistest.Start(t, "--appendonly", "yes", "--appendfsync", "always")
//		srv.Do(t, "SET", "k", "v")
//		srv.Kill(t)    // SIGKILL, as a crash would
//		srv.Restart(t) // same port, same dir, same args
//		if got := srv.Do(t, "GET", "k"); got != "v" {
//			t.Fatalf("GET k = %q after restart, want %q", got, "v")
//		}
//	}
//
// Methods that take a testing.TB report failures with t.Fatal, so they must
// be called from the goroutine running the test; Server.Command reports
// errors as values and may be called from any goroutine.
//
// It lives in testkit, the packages that serve idem's own tests and those
// who write a store or a broker adapter for idem (docs/design.md#where-new-code-goes);
// its API is not covered by the modules' compatibility promise and may
// change in any release.
package redistest
