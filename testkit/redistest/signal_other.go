//go:build !unix

package redistest

import (
	"errors"
	"os"
)

var errNoSignals = errors.New("stopping and pausing processes with signals needs a Unix system")

func terminate(*os.Process) error { return errNoSignals }
func pause(*os.Process) error     { return errNoSignals }
func resume(*os.Process) error    { return errNoSignals }
