// Package pause is scenario 3 of the reliability suite: the owner of a key
// is stopped with SIGSTOP for twice its lease, another owner takes the key
// over and completes it, and the stopped one is resumed with SIGCONT and
// goes on as if nothing had happened.
//
// The stale owner's complete must be refused with idem.ErrLeaseLost and its
// write refused by a fenced sink, every time; an unfenced sink in the same
// run is the negative control that must show the duplicate, proving that
// the test can see one.
//
//	make chaos RUN=TestOwnerPause
//	make chaos-long RUN=TestOwnerPause
package pause
