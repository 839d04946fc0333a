// Package ownercrash is scenario 2 of the reliability suite, for the HTTP
// proxy and the library: the owner of a key is killed with SIGKILL in the
// middle of its operation.
//
// The key is taken over once the lease ends (the tests measure how long
// after the crash, p50 and p99), the operation runs again with a larger
// fence, and a fenced sink keeps exactly one standing effect per key and
// refuses a late write with the killed owner's fence. Behind the proxy the
// upstream learns the fence from the Idempotency-Fence header that the
// proxy sets (--fence-header).
//
//	make chaos RUN=TestOwnerCrash
//	make chaos-long RUN=TestOwnerCrash
package ownercrash
