package outbox

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem/chaos/chaostest"
	"github.com/idemgo/idem/postgres/pgoutbox"
)

// envUntilEmpty makes the relay child exit ("done") once no row is unsent.
const envUntilEmpty = "IDEM_OB_UNTIL_EMPTY"

// stopAfterConfirm is a Sender that counts the broker's confirmations per
// key in the control Redis and, at the kill points (keys whose number is
// every/2 modulo every, once per key across restarts), stops the process
// right after the broker confirmed the message: before the relay marks
// the row sent.
type stopAfterConfirm struct {
	inner pgoutbox.Sender
	ctl   *redis.Client
	every int
}

func (s *stopAfterConfirm) Send(ctx context.Context, key string, payload []byte, headers map[string]string) error {
	if err := s.inner.Send(ctx, key, payload, headers); err != nil {
		return err
	}
	bg := context.WithoutCancel(ctx)
	if err := s.ctl.Incr(bg, "ob:sent:"+key).Err(); err != nil {
		fmt.Fprintf(os.Stderr, "relay: count the send: %v\n", err)
	}
	if s.every > 0 && keyNumber(key)%s.every == s.every/2 {
		if ok, err := s.ctl.SetNX(bg, "ob:stopped:relay:"+key, 1, 0).Result(); err == nil && ok {
			stopSelf("relay %s", key)
		}
	}
	return nil
}

// keyNumber returns the first number in key ("order-0042:created": 42).
func keyNumber(key string) int {
	i := strings.IndexAny(key, "0123456789")
	if i < 0 {
		return -1
	}
	j := i
	for j < len(key) && key[j] >= '0' && key[j] <= '9' {
		j++
	}
	n, _ := strconv.Atoi(key[i:j])
	return n
}

// runRelay is the relay child: a pgoutbox.Relay on the outbox of envPG,
// to the broker of the environment, through stopAfterConfirm.
func runRelay() error {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(envPG))
	if err != nil {
		return err
	}
	defer pool.Close()
	s, closeSender, err := newSender()
	if err != nil {
		return err
	}
	defer closeSender()
	ctl := redis.NewClient(&redis.Options{Addr: os.Getenv(envCtl)})
	defer ctl.Close()
	every, _ := strconv.Atoi(os.Getenv(envStopEvery))
	r, err := pgoutbox.New(pool, map[string]pgoutbox.Sender{destination: &stopAfterConfirm{inner: s, ctl: ctl, every: every}},
		pgoutbox.WithBatchSize(10), pgoutbox.WithBackoff(20*time.Millisecond, 200*time.Millisecond),
		pgoutbox.WithSendTimeout(5*time.Second))
	if err != nil {
		return err
	}
	until := os.Getenv(envUntilEmpty) != ""
	chaostest.Say("started")
	for {
		if _, err := r.Send(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "relay: %v\n", err)
		}
		if until {
			var n int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM idem_outbox WHERE sent_at IS NULL`).Scan(&n); err == nil && n == 0 {
				chaostest.Say("done")
				return nil
			}
		}
		time.Sleep(20 * time.Millisecond) // the relay's interval between passes
	}
}
