// Package storefull is scenario 11 of the reliability suite
// (RELIABILITY.md): a store that takes the acquire of a request and then
// refuses its completion (or, for a response too large to store, its
// FAILED mark), in front of the real `idem proxy` binary.
//
//   - TestStoreFullAfterAcquire: retrying clients send requests through the
//     proxy while the store keeps filling up and freeing room: Redis with
//     noeviction whose maxmemory drops below its memory in use for windows
//     longer than the lease (every write is refused: OOM), and the embedded
//     store whose process's file size limit (RLIMIT_FSIZE, set with
//     prlimit on the running proxy) drops to 8 KiB, the bbolt file's two
//     meta pages, for the same windows (every write past it, of a log
//     frame or a page, fails with EFBIG, as on a full disk; reads go on).
//     A request whose acquire went through before a window and whose
//     completion falls in it cannot be recorded. Asserted: no client is told a success that
//     was not recorded (every key a client got a 2xx for replays that very
//     response at the end), and every second execution of a key follows a
//     503 TypeOutcomeUnknown given to that key's client. The negative
//     control runs the proxy with --stream-all (responses written through
//     and stored afterwards, as before record before success) and must see
//     clients told a success that was not recorded.
//
//     make chaos RUN=TestStoreFullAfterAcquire
//     make chaos-long RUN=TestStoreFullAfterAcquire
//
//   - TestStreamNotRecorded: responses that stream through the proxy
//     (text/event-stream, and bodies over --max-response, whose key the
//     proxy must mark FAILED) while Redis refuses every write, from each
//     key's acquire until the proxy logged that it gave up recording it.
//     Asserted: no client reads a whole response that was not recorded
//     (the proxy withholds its end and aborts the connection), the log
//     never says that such a key is FAILED, and each key runs again once
//     its lease ends. The negative control (--stream-all: written through,
//     end included) must see clients read whole unrecorded responses.
//
//     make chaos RUN=TestStreamNotRecorded
//     make chaos-long RUN=TestStreamNotRecorded
//
// The tests live in _test.go files; this package has no API.
package storefull
