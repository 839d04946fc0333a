// Package storm is scenario 1 of the reliability suite: a duplicate storm.
//
// Every key is sent 20 times, concurrently, by 4 child processes (the test
// binary run again as a role, see chaostest.StartChild): through two `idem
// proxy` processes sharing one redis-server in front of one upstream, and
// through the library (an idem.Executor over redisstore in each child).
// The operation puts a random nonce in what it returns, so a second
// execution would show. The tests assert that every key executed exactly
// once and that every answer, original or replay, is byte-identical to the
// original.
//
//	make chaos RUN=TestDuplicateStorm
//	make chaos-long RUN=TestDuplicateStorm
package storm
