package storekit

import "context"

// Watcher is implemented by stores that can wake callers waiting for a
// record to leave IN_PROGRESS, across processes (redisstore publishes on a
// channel that shares the record's hash tag). idem.Executor.Await uses it when the
// store has it and polls otherwise.
type Watcher interface {
	// Watch starts watching key. The returned channel is closed or receives
	// a value at the latest once the record leaves IN_PROGRESS through
	// Complete, Fail, Release or Delete after Watch returned. stop releases
	// the watch; it must be called.
	Watch(ctx context.Context, key string) (changed <-chan struct{}, stop func(), err error)
}
