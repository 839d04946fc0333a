package outbox

import (
	"fmt"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/idemgo/idem/chaos/chaostest"
)

// waitTimeout bounds every wait of the scenarios.
const waitTimeout = 120 * time.Second

// Environment of the children, besides the broker's (envKind, envBroker,
// envDest).
const (
	envPG        = "IDEM_OB_PG"         // the Postgres URL of the child's database
	envCtl       = "IDEM_OB_CTL"        // the control Redis: markers of the kill points, counters
	envStopEvery = "IDEM_OB_STOP_EVERY" // the kill points: every how many keys
)

func TestMain(m *testing.M) {
	if role := chaostest.Role(); role != "" {
		os.Exit(runChild(role))
	}
	os.Exit(m.Run())
}

func runChild(role string) int {
	var err error
	switch role {
	case "relay":
		err = runRelay()
	case "service-a":
		err = runServiceA()
	case "service-b":
		err = runServiceB()
	default:
		err = fmt.Errorf("unknown role %q", role)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", role, err)
		return 1
	}
	return 0
}

// stopSelf reports a kill point to the parent and stops the process
// (SIGSTOP), which the parent then kills. The stop of a multi-threaded
// process is not immediate: the calling goroutine blocks for good, so that
// nothing after the kill point runs in it.
func stopSelf(format string, args ...any) {
	chaostest.Say("stopped "+format, args...)
	syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	select {}
}
