package main

import (
	"io"
	"log/slog"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/idemgo/idem/memstore"
	"github.com/idemgo/idem/testkit/readmetest"
)

// TestReadmeCommands runs the curl commands of the README against the
// API and checks what each comment says: the status, the payment id
// or a member of the body ("id":"pay_1"), a replay, and the number of
// payments listed.
func TestReadmeCommands(t *testing.T) {
	store, err := memstore.New()
	if err != nil {
		t.Fatal(err)
	}
	h, err := newHandler(store, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)

	status := regexp.MustCompile(`^\d{3}\b`)
	member := regexp.MustCompile(`"[a-z]+":("[^"]*"|\d+)`)
	var first string
	for i, c := range readmetest.Commands(t, "README.md", "<!-- commands: TestReadmeCommands") {
		res, err := srv.Client().Do(readmetest.CurlRequest(t, c, srv.URL))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(res.Body)
		res.Body.Close()
		body := string(b)
		if want, _ := strconv.Atoi(status.FindString(c.Comment)); res.StatusCode != want {
			t.Errorf("%s: got %d %s, want %d", c.Line, res.StatusCode, body, want)
		}
		if want := member.FindString(c.Comment); want != "" && !strings.Contains(body, want) {
			t.Errorf("%s: got %s, want %s", c.Line, body, want)
		}
		if strings.Contains(c.Comment, "Idempotent-Replayed: true") && (res.Header.Get("Idempotent-Replayed") != "true" || body != first) {
			t.Errorf("%s: got %s replayed=%q, want the first response replayed", c.Line, body, res.Header.Get("Idempotent-Replayed"))
		}
		if strings.Contains(c.Comment, "one payment") && strings.Count(body, `"id"`) != 1 {
			t.Errorf("%s: got %s, want one payment", c.Line, body)
		}
		if i == 0 {
			first = body
		}
	}
}
