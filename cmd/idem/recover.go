package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/idemgo/idem/boltstore"
	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/cmd/idem/internal/storeopen"
)

func recoverCommand() *command {
	return &command{
		name:    "recover",
		args:    "[flags]",
		summary: "repair the embedded store when its log is damaged",
		doc: `
Repairs the embedded store in --data when its log is damaged: the proxy and
the other commands refuse to start on such a store, name the damaged log
file and the offset, and point here. The log holds the writes acknowledged
since the last checkpoint; bytes in its middle were overwritten (a disk or
a program), while later writes were read fine. Starting without the writes
after the damage would run their requests again.

recover reads every write of the log that can be read, past the damage;
copies both log files aside first (DIR/idem.db.log.0 and .log.1 with
.damaged-TIME added: the damage is kept for inspection, never deleted);
applies what it read to DIR/idem.db; and reports what was lost: where each
damaged region is and how many groups of writes it held. Their records are
lost: a key whose last write was among them reads as the writes before left
it (in progress, or absent), and a retried request with that key may run
again. The store then opens.

On a log without damage, recover does what the proxy's start does (it
applies the log) and says that nothing was lost. Damage that reaches the end of the log cannot be told from
a write that a crash tore (never acknowledged) and ends the log on start,
as such a write does. Stop the proxy first. A damaged idem.db itself cannot
be repaired this way: move it aside, or restore it from a backup.`,
		flags: func(fs *cli.Set) func(context.Context, *env, []string) error {
			var data string
			fs.String(&data, "data", "DIR", defaultDataDir, "directory of the embedded store (files DIR/"+dataFile+" and DIR/"+dataFile+".log.*)")
			return func(_ context.Context, e *env, args []string) error {
				if len(args) > 0 {
					return cli.Usagef("recover: unexpected argument %q", args[0])
				}
				if data == "" {
					return cli.Usagef("--data is empty; give the directory of the embedded store")
				}
				path := filepath.Join(data, dataFile)
				if _, err := os.Stat(path); err != nil {
					return fmt.Errorf("no embedded store at %s (%v); give --data", path, cli.Cause(err))
				}
				rec, err := boltstore.Recover(path)
				switch {
				case errors.Is(err, boltstore.ErrLocked):
					return fmt.Errorf("the embedded store %s is in use by another process (a running proxy?); stop it first", path)
				case errors.Is(err, boltstore.ErrCorrupt):
					return storeopen.DamagedError(path, err)
				case err != nil:
					return fmt.Errorf("cannot recover the embedded store in %s: %v", data, err)
				}
				printRecovery(e, path, rec)
				return nil
			}
		},
	}
}

// printRecovery reports what recover found and did.
func printRecovery(e *env, path string, rec *boltstore.Recovery) {
	if len(rec.Damage) == 0 {
		fmt.Fprintf(e.stdout, "the log of the embedded store %s has no damage: nothing lost, nothing copied (%d groups of writes it held are in %s)\n", path, rec.Frames, path)
		return
	}
	fmt.Fprintf(e.stdout, "repaired the embedded store %s\n", path)
	for _, d := range rec.Damage {
		fmt.Fprintf(e.stdout, "  damage: %s\n", d)
	}
	fmt.Fprintf(e.stdout, "  lost:   %d groups of writes\n", rec.Lost)
	fmt.Fprintf(e.stdout, "  kept:   %d groups of writes (%d records), now in %s\n", rec.Frames, rec.Records, path)
	fmt.Fprintf(e.stdout, "  copies of the damaged log: %s\n", strings.Join(rec.Saved, ", "))
	fmt.Fprintf(e.stdout, "A key whose last write was in a lost group reads as before it (in progress, or absent), and a retried request with it may run again; 'idem ls --data %s' lists the records.\n", filepath.Dir(path))
}
