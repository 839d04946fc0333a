// Package abuse is scenario 8 of the reliability suite (RELIABILITY.md):
// bad input and abuse against the real `idem proxy` binary, on its
// embedded store and on Redis, in front of a test upstream.
//
//   - TestOversizedBodies: request bodies over --max-body (declared, and a
//     1 GiB chunked body streamed from a generator) get 413 without reaching
//     the upstream, while the proxy's memory stays far below the body size;
//     a response over --max-response is delivered once, then the key is
//     FAILED and retries get 422.
//   - TestManyKeysOnePrincipal: 10^4 (long: 10^5) distinct keys from one
//     principal all execute once; the records live in the store (counted
//     there), not in the proxy's memory.
//   - TestHugeHeaders: a 1 MiB header, 10,000 headers, a 100 KiB key and
//     malformed keys get a clear 4xx and are never forwarded; the proxy
//     serves normally afterwards.
//   - TestCrossPrincipalReplay: with --scope-header Authorization, a second
//     principal reusing the first one's keys (same or other bodies) runs its
//     own requests and never receives the first principal's responses.
//   - TestSlowUploads: 1,000 connections trickling (or stalling in) almost
//     1 MiB bodies against the proxy at its default settings: what they
//     add to its memory stays under twice the bodies' memory and 32 KiB
//     per connection (126.5 MiB) and it keeps answering small requests; without
//     its bounds (the negative control) it goes far over.
//
// The tests live in _test.go files; this package has no API.
package abuse
