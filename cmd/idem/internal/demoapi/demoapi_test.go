package demoapi

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestAPI(t *testing.T) {
	h := New(slog.New(slog.NewTextHandler(io.Discard, nil)))
	do := func(method, path, body string) *httptest.ResponseRecorder {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, path, strings.NewReader(body)))
		return w
	}
	for i, body := range []string{`{"amount":1}`, `{"amount":2}`} {
		w := do("POST", "/orders", body)
		var ex Execution
		if err := json.NewDecoder(w.Body).Decode(&ex); err != nil || w.Code != http.StatusCreated || ex.Execution != i+1 || ex.Body != body {
			t.Fatalf("POST %d: got %d %+v %v, want 201 execution %d with its body", i+1, w.Code, ex, err, i+1)
		}
		if loc := w.Header().Get("Location"); loc != "/orders/"+string(rune('1'+i)) {
			t.Errorf("POST %d: got Location %q", i+1, loc)
		}
	}
	var list struct{ Executions []Execution }
	w := do("GET", "/orders", "")
	if err := json.NewDecoder(w.Body).Decode(&list); err != nil || len(list.Executions) != 2 {
		t.Errorf("GET: got %+v, %v, want 2 executions", list, err)
	}
	if w := do("DELETE", "/orders", ""); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("DELETE: got %d, want 405", w.Code)
	}
}
