// Package pgsteps holds the reliability scenarios of multi-step requests
// through the commit gate (pggate.Gate.Run, docs/postgres.md, RELIABILITY.md):
// a checkout (the order; a charge at a processor that honours
// Idempotency-Key; the charge recorded with "order paid" in the outbox)
// whose owner process is killed at every phase boundary, including after
// the processor charged and before its reply was recorded. Half of the
// orders are then finished by the completer (Gate.Complete), half by the
// client's retry. The outbox is then relayed to a Redis stream with lost
// confirmations (messages sent again) and processed by key downstream.
// Counted: charges at the processor, order and charge rows, outbox
// messages and processings downstream per order (1 each), and orders left
// unfinished after the completer (0). The negative control runs the same checkout
// without recovery points (the order committed on its own, the charge sent
// with a key of each attempt, everything run again on a retry) and shows
// the double orders and charges the steps prevent.
package pgsteps
