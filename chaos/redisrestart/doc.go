// Package redisrestart is scenario 4 of the reliability suite: redis-server
// is killed with SIGKILL while idem.Executor.Do runs under load, and
// restarted on the same port and directory. It counts the completed records
// that the restart lost, the executions that happened twice, the errors
// callers saw during the outage, and how long the clients (go-redis and
// rueidis, never recreated) took to work again.
//
// The package has only tests; run the short variant with
//
//	go test -race -count=1 ./redisrestart/
//
// and the long one (10 kills per variant) with IDEM_CHAOS=long.
package redisrestart
