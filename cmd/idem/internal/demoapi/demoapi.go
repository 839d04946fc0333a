// Package demoapi is the toy upstream of idem upstream-demo: an API that
// counts and lists its executions, so that a demo can show that a retry
// through the proxy did not run it again.
package demoapi

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Execution is one execution of the toy API, as it answers.
type Execution struct {
	Execution int    `json:"execution"`
	Method    string `json:"method"`
	Path      string `json:"path"`
	Body      string `json:"body"`
	At        string `json:"at"`
}

// New returns the toy API. A POST, PUT or PATCH is an execution: it is
// logged, counted and answered with 201 and its number; ?sleep=DURATION
// (up to a minute) makes it slow, to show a concurrent retry's 409. GET
// lists the executions so far. It is safe for concurrent use.
func New(log *slog.Logger) http.Handler {
	var mu sync.Mutex
	var done []Execution
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		switch r.Method {
		case http.MethodGet, http.MethodHead:
			mu.Lock()
			list := append([]Execution{}, done...)
			mu.Unlock()
			enc.Encode(map[string]any{"executions": list})
			return
		case http.MethodPost, http.MethodPut, http.MethodPatch:
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
			enc.Encode(map[string]string{"error": "method not allowed"})
			return
		}
		body, _ := io.ReadAll(io.LimitReader(r.Body, 64<<10))
		if s := r.URL.Query().Get("sleep"); s != "" {
			if d, err := time.ParseDuration(s); err == nil && d > 0 && d <= time.Minute {
				log.Info("sleeping", "for", d.String(), "method", r.Method, "path", r.URL.Path)
				time.Sleep(d)
			}
		}
		mu.Lock()
		ex := Execution{Execution: len(done) + 1, Method: r.Method, Path: r.URL.Path, Body: string(body), At: time.Now().UTC().Format(time.RFC3339Nano)}
		done = append(done, ex)
		mu.Unlock()
		log.Info("executed", "execution", ex.Execution, "method", r.Method, "path", r.URL.Path)
		w.Header().Set("Location", r.URL.Path+"/"+strconv.Itoa(ex.Execution))
		w.WriteHeader(http.StatusCreated)
		enc.Encode(ex)
	})
}
