// Package memstore is an in-process idem.Store: a map guarded by a mutex,
// with the same semantics as the Redis store (it passes the same
// conformance suite, storetest; its transitions are the pure functions
// boltstore uses too, so it keeps only the map). Use it in tests, in examples, and in a
// single process that needs no durability: its records are lost when the
// process exits.
//
// Its clock plays the part of the Redis server's clock and can be replaced
// with WithClock. Expired records are dropped when they are next touched and
// by a small sweep every 256 writes; there is no background goroutine.
//
//	store, _ := memstore.New()
//	exec, _ := idem.New(store)
package memstore
