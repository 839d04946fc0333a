// Package eviction is a scenario of the reliability suite (RELIABILITY.md):
// the `idem proxy` binary on a Redis whose maxmemory-policy evicts keys.
//
//   - TestEvictingRedis: on redis-server with maxmemory 4mb and
//     allkeys-lru, the proxy refuses to start, with one line naming the
//     policy, the fix and --allow-eviction. The negative control then starts
//     it with --allow-eviction, sends N keys with 2 KiB responses (far more
//     than 4 MiB of records), then every key again: each key whose record
//     was evicted runs a second time, and the duplicates are counted. It
//     shows what the start check guards against.
//
// The tests live in _test.go files; this package has no API.
package eviction
