package idemhttp

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
)

// Error bodies for clients that expect another shape than problem details.
// A client library that reads every JSON body of its API's shape may take
// a problem+json 409 for a created object, or retry a 422 that says not to:
// Stripe's SDKs do both. WriteStripeError and TemplateErrorHandler answer
// in the shape such clients read as an error; the status codes, Retry-After
// and the decision are the same whatever the shape.

// Code returns the short name of p's kind in snake case: the name of its
// type under any base ("key_mismatch" for TypeKeyMismatch), or, for a type
// that is not one of this package's, the status text ("bad_gateway").
func (p *Problem) Code() string {
	if name := problemName(p.Type); name != "" {
		return strings.ReplaceAll(name, "-", "_")
	}
	return strings.ToLower(strings.ReplaceAll(http.StatusText(p.Status), " ", "_"))
}

// Retryable reports whether a client may send the request again with the
// same key and expect another answer: true for 408, 409, 429 and 5xx
// statuses other than 500 (in progress, busy, store unreachable, outcome
// unknown, upstream errors), false otherwise (the request is wrong, the key
// was used for another request, or the key is FAILED).
func (p *Problem) Retryable() bool {
	switch p.Status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests:
		return true
	}
	return p.Status > 500 && p.Status <= 599
}

// WriteStripeError is an ErrorHandler that writes errors as Stripe's API
// does, for clients built on Stripe's SDKs:
//
//	{"error":{"type":"idempotency_error","code":"in_progress","message":"..."}}
//
// with Content-Type application/json and Stripe-Should-Retry: true or false
// (Problem.Retryable). The type is idempotency_error for 409 and for a key
// mismatch, invalid_request_error for other 4xx and api_error for 5xx; the
// code is Problem.Code; the message is the detail, or the title when there
// is none. A key mismatch is answered with 400 instead of 422, as Stripe
// answers the reuse of a key with other parameters (it sets p.Status, so
// that hooks report the status sent): stripe-node makes an
// idempotency_error a StripeIdempotencyError only for 400 and 404.
//
// Of the SDKs, stripe-node obeys Stripe-Should-Retry before its own rules;
// stripe-go (v85) never retries an error it decoded from the body, except a
// 429 lock_timeout, whatever the field says, so it does not retry a 409:
// use WriteStripeError with WithWait (the idem proxy's stripe preset waits
// up to the lease), so that a retry sent while the first request runs
// waits for its response instead of getting 409.
func WriteStripeError(w http.ResponseWriter, r *http.Request, p *Problem) {
	if p.Status == http.StatusUnprocessableEntity && problemName(p.Type) == "key-mismatch" {
		p.Status = http.StatusBadRequest
	}
	typ := "api_error"
	switch {
	case p.Status == http.StatusConflict || p.Status == http.StatusUnprocessableEntity || problemName(p.Type) == "key-mismatch":
		typ = "idempotency_error"
	case p.Status >= 400 && p.Status <= 499:
		typ = "invalid_request_error"
	}
	msg := p.Detail
	if msg == "" {
		msg = p.Title
	}
	body, _ := json.Marshal(struct {
		Error struct {
			Type    string `json:"type"`
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}{Error: struct {
		Type    string `json:"type"`
		Code    string `json:"code"`
		Message string `json:"message"`
	}{typ, p.Code(), msg}})
	w.Header().Set("Stripe-Should-Retry", strconv.FormatBool(p.Retryable()))
	writeJSON(w, "application/json", p.Status, body)
}

// TemplateErrorHandler returns an ErrorHandler that writes errors in the
// shape of tmpl, a JSON document, with Content-Type application/json. In
// its strings, these placeholders are replaced by the problem's values:
// {{type}} (Problem.Type), {{code}} (Problem.Code), {{title}}, {{detail}},
// {{status}} and {{retry}} (Problem.Retryable). A string that is exactly
// "{{status}}" becomes a JSON number, and exactly "{{retry}}" a JSON
// boolean. For example:
//
//	{"error": {"code": "{{code}}", "message": "{{detail}}", "status": "{{status}}"}}
//
// It returns an error if tmpl is not one JSON value.
func TemplateErrorHandler(tmpl []byte) (ErrorHandler, error) {
	dec := json.NewDecoder(bytes.NewReader(tmpl))
	dec.UseNumber()
	var doc any
	if err := dec.Decode(&doc); err != nil {
		return nil, fmt.Errorf("idemhttp: error body template: %w", err)
	}
	if _, err := dec.Token(); err == nil {
		return nil, fmt.Errorf("idemhttp: error body template: more than one JSON value")
	}
	return func(w http.ResponseWriter, r *http.Request, p *Problem) {
		vals := strings.NewReplacer(
			"{{type}}", p.Type, "{{code}}", p.Code(), "{{title}}", p.Title, "{{detail}}", p.Detail,
			"{{status}}", strconv.Itoa(p.Status), "{{retry}}", strconv.FormatBool(p.Retryable()))
		body, err := json.Marshal(fill(doc, p, vals))
		if err != nil { // cannot happen: fill returns what json decoded
			body = []byte(`{"status":` + strconv.Itoa(p.Status) + `}`)
		}
		writeJSON(w, "application/json", p.Status, body)
	}, nil
}

// fill returns a copy of the template value v with its placeholders
// replaced.
func fill(v any, p *Problem, vals *strings.Replacer) any {
	switch v := v.(type) {
	case string:
		switch v {
		case "{{status}}":
			return p.Status
		case "{{retry}}":
			return p.Retryable()
		}
		return vals.Replace(v)
	case map[string]any:
		out := make(map[string]any, len(v))
		for k, e := range v {
			out[k] = fill(e, p, vals)
		}
		return out
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = fill(e, p, vals)
		}
		return out
	}
	return v
}

// writeJSON writes an error body with its media type and status.
func writeJSON(w http.ResponseWriter, contentType string, status int, body []byte) {
	h := w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}
