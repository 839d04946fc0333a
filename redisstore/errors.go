package redisstore

import "fmt"

// EvictionError is returned by New and NewRueidis when a server's
// maxmemory-policy is not noeviction. Every other policy can evict idem's
// records under memory pressure (they all carry a time to live, so the
// volatile-* policies too), and a retried request whose record was evicted
// runs again. Fix the server (CONFIG SET maxmemory-policy noeviction, and in
// its configuration file; keep caches on another server), or accept the
// risk with WithAllowEviction.
type EvictionError struct {
	Addr   string // the server's address, as the client knows it
	Policy string // its maxmemory-policy
}

func (e *EvictionError) Error() string {
	return fmt.Sprintf("redisstore: %s has maxmemory-policy %s, which can evict idempotency records (a retried request then runs again); set maxmemory-policy noeviction, or pass WithAllowEviction to accept that risk",
		e.Addr, e.Policy)
}

// VersionError is returned by New and NewRueidis when a server is older
// than the store needs: Redis 7.0 (SET … NX GET, SPUBLISH), or 7.2 with
// WithWaitAOF (WAITAOF). Valkey reports the Redis version it is compatible
// with (7.2 for Valkey 7.2 and 8), which is the one compared.
type VersionError struct {
	Addr    string // the server's address, as the client knows it
	Version string // the redis_version it reports
	Need    string // the oldest version that works, "7.0" or "7.2"
	Reason  string // what needs it
}

func (e *VersionError) Error() string {
	return fmt.Sprintf("redisstore: %s runs Redis %s; %s needs Redis %s or later (or Valkey): upgrade the server",
		e.Addr, e.Version, e.Reason, e.Need)
}

// WaitAOFError is returned by New and NewRueidis with WithWaitAOF when a
// server runs appendfsync everysec and its WAITAOF counts writes as
// fsynced before they are: Redis 7.4.0 and 7.4.1, Valkey 8.0.0 and 8.0.1
// by their version, and any other server where a watched write was
// acknowledged before an fsync could run (CheckWaitAOF; Redis 8.0-M01 and
// unstable builds of late 2024, for example; fixed upstream by
// redis/redis#13793). A store there would acknowledge records that a crash
// of the machine can lose. Set appendfsync always (every write is then
// fsynced before its reply), or upgrade the server.
type WaitAOFError struct {
	Addr   string // the server's address, as the client knows it
	Server string // its name and version, "redis 7.4.1" or "valkey 8.0.1"
	Reason string // what it does (WaitAOFCheck.Reason)
}

func (e *WaitAOFError) Error() string {
	return fmt.Sprintf("redisstore: %s runs %s, whose WAITAOF counts writes as fsynced before they are under appendfsync everysec (it %s): WithWaitAOF would acknowledge records that a crash of the machine can lose; set appendfsync always, or upgrade the server",
		e.Addr, e.Server, e.Reason)
}
