package main

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/redisstore"
	"github.com/redis/go-redis/v9"
)

// rightCheck is one command the store sends, tried on its own with the
// user's ACL on a scratch key.
type rightCheck struct {
	args     []any
	neededBy string
	missing  verdict // the verdict when the user may not run it
}

// doctorRights tries, with the user's ACL, each command idem's scripts and
// admin commands send, on a scratch key of the prefix, and names each one
// the user may not run; then, if none is missing, runs every transition the
// proxy uses on a scratch key through the store. (Inside a script, a denied
// command fails the script with an error that does not name it, so the
// commands are tried one by one first.) The scratch keys are deleted.
func doctorRights(ctx context.Context, r *report, c redis.UniversalClient, prefix string) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	st, err := redisstore.New(c, redisstore.WithPrefix(prefix), redisstore.WithAllowEviction(), redisstore.WithReplayCache(false),
		redisstore.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))))
	if err != nil {
		r.add(vFail, "rights", "not checked: %v", err)
		return
	}
	scratch := "idem-doctor-" + rand.Text()
	name := st.Key(scratch)
	defer c.Del(context.WithoutCancel(ctx), name)
	channel := name + ":w"
	pub, sub := "PUBLISH", "SUBSCRIBE"
	if _, ok := c.(*redis.ClusterClient); ok {
		pub, sub = "SPUBLISH", "SSUBSCRIBE"
	}
	checks := []rightCheck{
		{[]any{"EVAL", "return 1", "1", name}, "every transition (the scripts)", vFail},
		{[]any{"EVALSHA", "0000000000000000000000000000000000000000", "1", name}, "every transition (the cached scripts)", vFail},
		{[]any{"TIME"}, "every transition (the server's clock)", vFail},
		{[]any{"GET", name}, "every transition", vFail},
		{[]any{"SET", name, "doctor", "PX", "10000"}, "every transition", vFail},
		{[]any{"PTTL", name}, "get (replays)", vFail},
		{[]any{pub, channel, "doctor"}, "complete, fail and release (wake-ups)", vFail},
		{[]any{"DEL", name}, "idem rm", vWarn},
		{[]any{"SCAN", "0", "MATCH", prefix + "{*", "COUNT", "1"}, "idem ls", vWarn},
	}
	var missing []string
	for _, ch := range checks {
		err := c.Do(ctx, ch.args...).Err()
		if !redis.HasErrorPrefix(err, "NOPERM") {
			continue
		}
		cmd := ch.args[0].(string)
		missing = append(missing, cmd)
		r.add(ch.missing, "rights", "the user may not run %s, which %s needs; grant it (ACL SETUSER <user> +%s)", cmd, ch.neededBy, strings.ToLower(cmd))
	}
	if err := trySubscribe(ctx, c, sub, channel); redis.HasErrorPrefix(err, "NOPERM") {
		r.add(vWarn, "rights", "the user may not run %s: waiters (--wait) poll the record instead of being woken; grant it (ACL SETUSER <user> +%s)", sub, strings.ToLower(sub))
	}
	if len(missing) > 0 {
		r.add(vFail, "rights", "the transitions were not run: the user lacks %s", strings.Join(missing, ", "))
		return
	}
	if err := runTransitions(ctx, st, scratch); err != nil {
		r.add(vFail, "rights", "a transition failed on the scratch key %s: %v", name, err)
		return
	}
	r.add(vOK, "rights", "acquire, extend, complete, get, release, fail and delete ran on a scratch key of prefix %q", prefix)
}

func trySubscribe(ctx context.Context, c redis.UniversalClient, cmd, channel string) error {
	var ps *redis.PubSub
	if cmd == "SSUBSCRIBE" {
		ps = c.SSubscribe(ctx, channel)
	} else {
		ps = c.Subscribe(ctx, channel)
	}
	defer ps.Close()
	_, err := ps.Receive(ctx)
	return err
}

// runTransitions runs every transition the proxy uses on key: acquire,
// extend, complete, get and delete; then acquire, release, acquire, fail
// and delete.
func runTransitions(ctx context.Context, st *redisstore.Store, key string) error {
	const d = 10 * time.Second
	req := idem.AcquireRequest{Fingerprint: "doctor", Owner: "idem-doctor", Lease: d, Retention: d}
	acquire := func() (idem.Lease, error) {
		a, err := st.Acquire(ctx, key, req)
		if err != nil {
			return idem.Lease{}, fmt.Errorf("acquire: %w", err)
		}
		if a.Outcome != idem.Acquired && a.Outcome != idem.TakenOver {
			return idem.Lease{}, fmt.Errorf("acquire: got %v on a new key", a.Outcome)
		}
		return a.Lease, nil
	}
	steps := []func() error{
		func() error {
			l, err := acquire()
			if err != nil {
				return err
			}
			if err := st.Extend(ctx, key, l, d); err != nil {
				return fmt.Errorf("extend: %w", err)
			}
			if err := st.Complete(ctx, key, l, []byte("doctor"), d); err != nil {
				return fmt.Errorf("complete: %w", err)
			}
			return nil
		},
		func() error {
			if _, err := st.Get(ctx, key); err != nil {
				return fmt.Errorf("get: %w", err)
			}
			return st.Delete(ctx, key)
		},
		func() error {
			l, err := acquire()
			if err != nil {
				return err
			}
			if err := st.Release(ctx, key, l, d); err != nil {
				return fmt.Errorf("release: %w", err)
			}
			if l, err = acquire(); err != nil {
				return err
			}
			if _, err := st.Fail(ctx, key, l, idem.Failure{Result: []byte("doctor"), Terminal: true, Retention: d}); err != nil {
				return fmt.Errorf("fail: %w", err)
			}
			return st.Delete(ctx, key)
		},
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// invalidateChannel is where the server sends the invalidations of client
// tracking to a RESP2 connection (CLIENT TRACKING ... REDIRECT).
const invalidateChannel = "__redis__:invalidate"

// doctorReplayCache tries, with the user's ACL, what the tracking
// connection of the proxy's replay cache sends (see redisstore's package
// documentation, "Local replay cache"): CLIENT SETNAME, CLIENT ID and
// CLIENT TRACKING ON REDIRECT <own id> BCAST PREFIX <prefix> on a
// connection of its own, then SUBSCRIBE __redis__:invalidate. Without
// them the proxy serves, reads every replay from Redis and logs a warning,
// so a missing right is a WARN that names the ACL fix.
func doctorReplayCache(ctx context.Context, r *report, c *redis.Client, prefix string) {
	ctx, cancel := context.WithTimeout(ctx, connectTimeout)
	defer cancel()
	opt := *c.Options() // as the tracking connection: the client's options, RESP2, one connection
	opt.Protocol, opt.PoolSize, opt.MinIdleConns, opt.MaxIdleConns, opt.ClientName = 2, 1, 0, 0, ""
	tc := redis.NewClient(&opt)
	defer tc.Close()
	cn := tc.Conn()
	defer cn.Close()
	var missing, grants []string
	denied := func(err error, cmd, grant string) bool {
		if redis.HasErrorPrefix(err, "NOPERM") {
			missing, grants = append(missing, cmd), append(grants, grant)
			return true
		}
		return false
	}
	var errs []error
	if err := cn.Do(ctx, "CLIENT", "SETNAME", "idem-doctor").Err(); !denied(err, "CLIENT SETNAME", "+client|setname") && err != nil {
		errs = append(errs, err)
	}
	tracking := []any{"CLIENT", "TRACKING", "ON", "BCAST", "PREFIX", prefix}
	id, err := cn.ClientID(ctx).Result()
	if !denied(err, "CLIENT ID", "+client|id") && err != nil {
		errs = append(errs, err)
	}
	if err == nil {
		tracking = []any{"CLIENT", "TRACKING", "ON", "REDIRECT", id, "BCAST", "PREFIX", prefix}
	}
	err = cn.Do(ctx, tracking...).Err()
	if !denied(err, "CLIENT TRACKING", "+client|tracking") && err != nil {
		errs = append(errs, err)
	}
	if err == nil {
		_ = cn.Do(ctx, "CLIENT", "TRACKING", "OFF").Err()
	}
	const fallback = "the proxy reads every replay from Redis"
	if len(missing) > 0 {
		r.add(vWarn, "replay cache", "the user may not run %s, which the replay cache's tracking connection needs: %s; grant it (ACL SETUSER <user> %s)",
			strings.Join(missing, ", "), fallback, strings.Join(grants, " "))
	}
	subscribeErr := trySubscribe(ctx, tc, "SUBSCRIBE", invalidateChannel)
	if redis.HasErrorPrefix(subscribeErr, "NOPERM") {
		grant := "&" + invalidateChannel
		if redis.HasErrorPrefix(trySubscribe(ctx, tc, "SUBSCRIBE", prefix+"idem-doctor"), "NOPERM") {
			grant = "+subscribe " + grant // SUBSCRIBE itself may be denied
		}
		r.add(vWarn, "replay cache", "the user may not subscribe to %s, where the server sends the replay cache's invalidations: %s; grant it (ACL SETUSER <user> %s)",
			invalidateChannel, fallback, grant)
		missing = append(missing, "SUBSCRIBE")
	} else if subscribeErr != nil {
		errs = append(errs, subscribeErr)
	}
	switch {
	case len(errs) > 0:
		r.add(vWarn, "replay cache", "the tracking connection's commands failed (%v): %s", errors.Join(errs...), fallback)
	case len(missing) == 0:
		r.add(vOK, "replay cache", "CLIENT TRACKING on prefix %q and SUBSCRIBE %s allowed", prefix, invalidateChannel)
	}
}
