// Package valkey is redisstore's backend on a valkey-go client (standalone,
// Sentinel or Cluster). Its other files are generated from
// internal/rueidis (valkey-go is a fork of rueidis with the same API under
// other names): change internal/rueidis, then run go generate here.
package valkey

//go:generate go run ../genvalkey
