// Package effects holds the reliability scenarios of Redis-side effects
// (redisstore.WithEffect, idem.SetEffect): an effect on data in Redis —
// take one unit from a stock, count an order, append an event — applied in
// the same atomic call as the completion of the key's record.
//
//   - TestEffectOwnerKill: the owner is killed (SIGKILL) inside its
//     operation; a takeover applies the effect once. Control: the same
//     effect written with plain commands before the completion is applied
//     twice.
//   - TestEffectOwnerPause: the owner is stopped (SIGSTOP) past its lease; a
//     takeover completes first; the resumed owner's completion is refused and
//     its effect never applied. Control: plain commands before the
//     completion duplicate the effect for every key.
//   - TestEffectLostReply: the reply of the completion call is lost
//     (toxiproxy); the repeated call finds its own COMPLETED record and
//     applies nothing again. Control: the effect sent as a plain script and
//     repeated after its lost reply is applied twice.
//   - TestEffectFailsHalfWay: an effect that fails after its writes (a
//     command Redis refuses, its own error reply, a Lua error), tried 3
//     times per key: the completion call ends the key FAILED
//     (idem.ErrEffectPartial) and the writes stand once. Control: the same
//     writes as plain commands before the operation fails stand once per
//     try.
//   - TestEffectManyProcesses: 4 processes run every key 5 times each (20
//     duplicates per key) while one of them is paused past its lease now and
//     then: the stock, the order counter and the events equal the number of
//     keys, with no duplicate event. Control: the same run with plain
//     commands shows duplicates.
//
// make chaos runs the short variants; make chaos-long the soak sizes.
//
//	make chaos RUN=TestEffect
//	make chaos-long RUN=TestEffect
package effects
