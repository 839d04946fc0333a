// Package rueidis is redisstore's backend on a rueidis.Client (standalone,
// Sentinel or Cluster): script calls with their NOSCRIPT fallback,
// pipelines, the coalescer's calls, WAIT, SCAN, Functions loading, the
// subscriber connections, and the replay cache on rueidis's client-side
// cache (cache.go). internal/valkey is generated from it (internal/genvalkey).
package rueidis
