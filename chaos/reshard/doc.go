// Package reshard is scenario 9 of the reliability suite: slots of a
// 3-master Redis Cluster are moved with redis-cli --cluster reshard while
// go-redis and rueidis cluster clients run idem.Executor.Do on many keys,
// each key raced by several goroutines. It counts executions per key (which
// must be exactly one), the errors the callers saw, and the keys whose slot
// moved under them.
//
// The package has only tests; run the short variant with
//
//	go test -race -count=1 ./reshard/
//
// and the long one with IDEM_CHAOS=long.
package reshard
