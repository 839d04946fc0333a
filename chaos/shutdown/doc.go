// Package shutdown is scenario 12 of the reliability suite
// (RELIABILITY.md): the `idem proxy` binary stopped with SIGTERM while
// clients read their responses slowly.
//
//   - TestSlowReaderAtShutdown: slow readers (they read the header and then
//     stop) hold responses that fit --max-response (stored before they are
//     sent) and responses over it (streamed) when the proxy gets SIGTERM
//     with a short --shutdown-timeout. Asserted: the proxy exits, and after
//     a restart on the same embedded store every key's retry gets its
//     outcome without a second execution: the stored response, or 422 for a
//     response too large to replay. The negative control kills the proxy
//     (SIGKILL) at the same point instead, so that nothing is stored at
//     shutdown: its retries run again once the lease has ended.
//
//     make chaos RUN=TestSlowReaderAtShutdown
//     make chaos-long RUN=TestSlowReaderAtShutdown
//
// The tests live in _test.go files; this package has no API.
package shutdown
