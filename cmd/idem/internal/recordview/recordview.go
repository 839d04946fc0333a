// Package recordview shows idempotency records to people: the record of
// one key (idem get) and a table of records (idem ls), with the stored
// HTTP response decoded by idemhttp/httpkit.
package recordview

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapterkit"
	"github.com/idemgo/idem/cmd/idem/internal/storeopen"
	"github.com/idemgo/idem/idemhttp/httpkit"
	"github.com/idemgo/idem/storekit"
)

// stored describes a record's stored result: for a COMPLETED record the
// response's status and body size, for a FAILED one its failure.
type stored struct {
	resp    *httpkit.Response
	failure string
	err     error
}

func decode(exec *idem.Executor, key string, rec storekit.Record) stored {
	if len(rec.Result) == 0 {
		return stored{}
	}
	v, err := adapterkit.DecodeResult(exec, key, rec.Result)
	if err != nil {
		return stored{err: err}
	}
	if rec.State == storekit.StateFailed {
		return stored{failure: string(v)}
	}
	resp, err := httpkit.DecodeResponse(v)
	if err != nil {
		return stored{err: err}
	}
	return stored{resp: &resp}
}

// Age renders a duration for people: 1h2m3s, 4.5s, 120ms.
func Age(d time.Duration) string {
	switch {
	case d <= 0:
		return "0s"
	case d >= time.Minute:
		return d.Round(time.Second).String()
	case d >= time.Second:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Millisecond).String()
}

// printTimes prints when rec was created, the lease it has left and when
// it expires, as far as they are known.
func printTimes(line func(k, format string, args ...any), rec storekit.Record) {
	if !rec.Created.IsZero() {
		line("created", "%s (%s ago)", rec.Created.UTC().Format(time.RFC3339), Age(rec.Now.Sub(rec.Created)))
	}
	if rec.State == storekit.StateInProgress {
		if left := rec.LeaseUntil.Sub(rec.Now); left > 0 {
			line("lease left", "%s", Age(left))
		} else {
			line("lease left", "none: expired %s ago; the next request takes the key over", Age(-left))
		}
	}
	if !rec.ExpiresAt.IsZero() {
		line("expires in", "%s", Age(rec.ExpiresAt.Sub(rec.Now)))
	}
}

// Print prints the record of key (redisKey: its key in Redis, empty for
// other stores), its result decoded by exec, and with showBody the stored
// response's header fields and body.
func Print(w io.Writer, exec *idem.Executor, key, redisKey string, rec storekit.Record, showBody bool) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	line := func(k, format string, args ...any) { fmt.Fprintf(tw, "%s\t%s\n", k, fmt.Sprintf(format, args...)) }
	line("digest", "%s", key)
	if redisKey != "" {
		line("redis key", "%s", redisKey)
	}
	line("state", "%s", rec.State)
	line("fence", "%d", rec.Fence)
	line("attempts", "%d", rec.Attempts)
	printTimes(line, rec)
	s := decode(exec, key, rec)
	switch {
	case s.err != nil:
		line("stored", "%d bytes, cannot be decoded: %v", len(rec.Result), s.err)
	case s.resp != nil:
		line("status", "%d", s.resp.Status)
		line("stored", "%d bytes (response body %d bytes)", len(rec.Result), len(s.resp.Body))
	case s.failure != "":
		line("failure", "%s", s.failure)
	case rec.State == storekit.StateFailed:
		line("failure", "attempts exhausted")
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if showBody && s.resp != nil {
		printResponse(w, s.resp)
	}
	return nil
}

// printResponse prints a stored response: its status line, its header
// fields in order and its body.
func printResponse(w io.Writer, resp *httpkit.Response) {
	fmt.Fprintf(w, "\nHTTP %d %s\n", resp.Status, http.StatusText(resp.Status))
	for _, k := range slices.Sorted(maps.Keys(resp.Header)) {
		for _, v := range resp.Header[k] {
			fmt.Fprintf(w, "%s: %s\n", k, v)
		}
	}
	fmt.Fprintln(w)
	w.Write(resp.Body)
	if n := len(resp.Body); n > 0 && resp.Body[n-1] != '\n' {
		fmt.Fprintln(w)
	}
}

// List prints entries as a table: digest, state, fence, attempts, age,
// time to expiry, the stored status and size.
func List(w io.Writer, exec *idem.Executor, entries []storeopen.Entry) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DIGEST\tSTATE\tFENCE\tATTEMPTS\tAGE\tEXPIRES IN\tSTATUS\tSIZE")
	for _, en := range entries {
		rec := en.Record
		status, size := "-", "-"
		s := decode(exec, en.Key, rec)
		switch {
		case s.err != nil:
			status = "corrupt"
		case s.resp != nil:
			status = strconv.Itoa(s.resp.Status)
		case rec.State == storekit.StateFailed:
			status = "failed"
		}
		if len(rec.Result) > 0 {
			size = strconv.Itoa(len(rec.Result))
		}
		created, expires := "-", "-"
		if !rec.Created.IsZero() { // none in a record the relay wrote to Redis
			created = Age(rec.Now.Sub(rec.Created))
		}
		if !rec.ExpiresAt.IsZero() {
			expires = Age(rec.ExpiresAt.Sub(rec.Now))
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\n", en.Key, rec.State, rec.Fence, rec.Attempts,
			created, expires, status, size)
	}
	return tw.Flush()
}
