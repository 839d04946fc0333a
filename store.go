package idem

import "github.com/idemgo/idem/storekit"

// Store holds the records of an Executor (New): memstore, boltstore,
// redisstore, pgstore, or a wrapper around one of them. It is
// storekit.Store, where the contract a store implements and its optional
// capabilities are documented; an application names it only to choose a
// store at run time.
type Store = storekit.Store

// Lease identifies one acquisition of a key: the owner token, and the
// fencing token (Fence) to pass to side effects so that they can reject a
// stale owner. Attempt.Lease and LeaseFrom return it. It is
// storekit.Lease.
type Lease = storekit.Lease

// Effect is work on data in the store's own server that the store applies
// in the same atomic call as an attempt's completion (SetEffect). It is
// storekit.Effect, where its fields are documented.
type Effect = storekit.Effect
