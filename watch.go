package idem

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/storekit"
)

// Await blocks until key's record is not IN_PROGRESS (it completed, failed,
// was released, was deleted, or its lease expired) or ctx is done, and
// returns nil or ctx's error. Callers then call Begin or Do again to get the
// replay or the key; WithWait and WaitFor make Do and Begin do all of it. On a store that implements storekit.Watcher (also beneath
// wrappers that unwrap to it, see storekit.StoreAs), Await is woken by
// the store's notification (and looks again every second in case one was
// lost); otherwise it polls every 50ms. It never waits past the lease's end.
func (e *Executor) Await(ctx context.Context, key Key) error {
	if err := key.Validate(); err != nil {
		return err
	}
	skey := key.Digest()
	w, _ := storekit.StoreAs[storekit.Watcher](e.store)
	for {
		var changed <-chan struct{}
		stop := func() {}
		if w != nil {
			ch, s, err := w.Watch(ctx, skey)
			if err != nil {
				return fmt.Errorf("idem: watch: %w", err)
			}
			changed, stop = ch, s
		}
		rec, err := e.store.Get(ctx, skey)
		if errors.Is(err, storekit.ErrNotFound) {
			stop()
			return nil
		}
		if err != nil {
			stop()
			return fmt.Errorf("idem: get: %w", err)
		}
		left := rec.LeaseUntil.Sub(rec.Now)
		if rec.State != storekit.StateInProgress || left <= 0 {
			stop()
			return nil
		}
		if w == nil {
			left = min(left, 50*time.Millisecond)
		} else {
			// A notification can be lost (a reconnect, a PUBLISH after
			// a DEL that failed on its own): look again at least every
			// second.
			left = min(left, time.Second)
		}
		t := time.NewTimer(left)
		select {
		case <-ctx.Done():
			t.Stop()
			stop()
			return ctx.Err()
		case <-changed:
		case <-t.C:
		}
		t.Stop()
		stop()
	}
}
