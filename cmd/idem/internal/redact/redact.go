// Package redact hides the secrets of the URLs and passwords given to the
// idem binary in whatever it prints.
//
// Every message and log line that may show a URL given on the command line
// (--redis, --redis-cluster, --postgres, --upstream, --otel-endpoint, and
// any flag added later that takes one) shows it through URL. Beyond that,
// the flags that take a URL or a password are registered as such, and
// what a command prints passes through a Hider made of their values: the
// error of every command, doctor's lines, relay's, and the proxy's log. An
// error of a client library that quotes the URL, or the password alone,
// decoded or not, is covered that way.
package redact

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
)

// Secret stands for a hidden secret.
const Secret = "xxxxx"

// secretWords are the parts of a query parameter's or a connection
// keyword's name that mark its value as a secret (password, sslpassword,
// passfile, pwd, client_secret, token, api_key, sslkey, ...). A path (a
// passfile, an sslkey) is hidden too: better one path too many.
var secretWords = []string{"pass", "pwd", "secret", "token", "key"}

// secretName reports whether a parameter named name may hold a secret.
func secretName(name string) bool {
	if u, err := url.QueryUnescape(name); err == nil {
		name = u
	}
	name = strings.ToLower(name)
	for _, w := range secretWords {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// textPart is a part of a string, s[start:end].
type textPart struct{ start, end int }

// secretSpans returns the parts of the URL s that are secrets: the
// password of the user information (all of it when it has no colon, a
// token in the user name, except for postgres://, where it is the user
// name), and the value of every query parameter whose name suggests a
// secret. A Postgres keyword/value connection string (host=h
// password=pw) gets the values of such keywords. It reads the text, so it
// works on strings that do not parse as a URL too.
func secretSpans(s string) []textPart {
	if !strings.Contains(s, "://") && IsKeywordValue(s) {
		return keywordSpans(s)
	}
	start := 0
	if i := strings.Index(s, "://"); i >= 0 {
		start = i + 3
	}
	authEnd := len(s)
	if i := strings.IndexAny(s[start:], "/?#"); i >= 0 {
		authEnd = start + i
	}
	var out []textPart
	if p, ok := userSecret(s, start, authEnd); ok {
		out = append(out, p)
	}
	return append(out, querySecrets(s, authEnd)...)
}

// userSecret returns the secret of the user information of the authority
// s[start:end], which is what precedes its last @.
func userSecret(s string, start, end int) (textPart, bool) {
	at := strings.LastIndexByte(s[start:end], '@')
	if at <= 0 {
		return textPart{}, false
	}
	if i := strings.IndexByte(s[start:start+at], ':'); i >= 0 {
		return textPart{start + i + 1, start + at}, i+1 < at
	}
	return textPart{start, start + at}, !isPostgres(s)
}

// querySecrets returns the values of the secret parameters of the query of
// s, if it has one after from.
func querySecrets(s string, from int) []textPart {
	q := strings.IndexByte(s, '?')
	if q < 0 || q < from {
		return nil
	}
	end := len(s)
	if i := strings.IndexByte(s[q:], '#'); i >= 0 {
		end = q + i
	}
	var out []textPart
	for pos := q + 1; pos < end; {
		next := strings.IndexByte(s[pos:end], '&')
		if next < 0 {
			next = end - pos
		}
		name, _, hasValue := strings.Cut(s[pos:pos+next], "=")
		if hasValue && secretName(name) && pos+len(name)+1 < pos+next {
			out = append(out, textPart{pos + len(name) + 1, pos + next})
		}
		pos += next + 1
	}
	return out
}

// isPostgres reports whether the URL s has a Postgres scheme.
func isPostgres(s string) bool {
	scheme, _, _ := strings.Cut(s, "://")
	scheme = strings.ToLower(scheme)
	return scheme == "postgres" || scheme == "postgresql"
}

// IsKeywordValue reports whether s reads as a Postgres keyword/value
// connection string: its first word is keyword=value.
func IsKeywordValue(s string) bool {
	word, _, _ := strings.Cut(strings.TrimSpace(s), " ")
	k, _, ok := strings.Cut(word, "=")
	return ok && k != "" && !strings.ContainsAny(k, "/:@?")
}

// keywordSpans returns the values of the secret keywords of the keyword/value
// connection string s (keyword = value, the value bare or in single quotes
// with \' and \\ escapes, as libpq reads it); a quoted value's span holds
// what is inside the quotes.
func keywordSpans(s string) []textPart {
	var out []textPart
	for i := skipSpace(s, 0); i < len(s); i = skipSpace(s, i) {
		k := i
		for i < len(s) && s[i] != '=' && s[i] != ' ' {
			i++
		}
		name := s[k:i]
		if i = skipSpace(s, i); i >= len(s) || s[i] != '=' {
			continue // not keyword=value: a word to step over
		}
		var v textPart
		v, i = keywordValue(s, skipSpace(s, i+1))
		if secretName(name) && v.end > v.start {
			out = append(out, v)
		}
	}
	return out
}

// keywordValue returns the value that starts at s[i], bare or quoted, and
// the index after it.
func keywordValue(s string, i int) (textPart, int) {
	if i < len(s) && s[i] == '\'' {
		v := textPart{start: i + 1}
		for i++; i < len(s) && s[i] != '\''; i++ {
			if s[i] == '\\' {
				i++
			}
		}
		v.end = min(i, len(s))
		return v, i + 1
	}
	v := textPart{start: i}
	for i < len(s) && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' {
		i++
	}
	v.end = i
	return v, i
}

// skipSpace returns the index of the first byte of s from i that is not a
// space.
func skipSpace(s string, i int) int {
	for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
		i++
	}
	return i
}

// URL returns the URL (or connection string) s with each secret
// secretSpans finds replaced by xxxxx: redis://user:xxxxx@host,
// https://xxxxx@host, postgres://u@h/db?password=xxxxx,
// host=h password=xxxxx.
func URL(s string) string {
	spans := secretSpans(s)
	if len(spans) == 0 {
		return s
	}
	var b strings.Builder
	last := 0
	for _, sp := range spans {
		b.WriteString(s[last:sp.start])
		b.WriteString(Secret)
		last = sp.end
	}
	b.WriteString(s[last:])
	return b.String()
}

// Hider hides, in any text, the secrets of the URLs and passwords given on
// the command line. The zero value and nil hide nothing. It is safe for
// concurrent use.
type Hider struct{ r *strings.Replacer }

// NewHider returns the hider of urls (each hidden as URL shows it,
// as given and as %q quotes it, and each of its secrets wherever it
// appears, as given and decoded) and passwords (wherever they appear).
func NewHider(urls, passwords []string) *Hider {
	var pairs []string
	seen := make(map[string]bool)
	add := func(old, new string) {
		if old != "" && old != new && !seen[old] {
			seen[old] = true
			pairs = append(pairs, old, new)
		}
	}
	quoted := func(s string) string { q := strconv.Quote(s); return q[1 : len(q)-1] }
	var secrets []string
	// The whole URLs first: the replacer tries the pairs in order at each
	// position, and a URL is longer than its secrets.
	for _, raw := range urls {
		spans := secretSpans(raw)
		if len(spans) == 0 {
			continue
		}
		red := URL(raw)
		add(raw, red)
		add(quoted(raw), quoted(red))
		for _, sp := range spans {
			secrets = append(secrets, raw[sp.start:sp.end])
		}
	}
	secrets = append(secrets, passwords...)
	for _, sec := range secrets {
		add(sec, Secret)
		add(quoted(sec), Secret)
		if u, err := url.QueryUnescape(sec); err == nil {
			add(u, Secret)
			add(quoted(u), Secret)
		}
		if u, err := url.PathUnescape(sec); err == nil {
			add(u, Secret)
		}
		if strings.Contains(sec, `\`) { // a quoted keyword value: \' and \\
			add(strings.NewReplacer(`\'`, `'`, `\\`, `\`).Replace(sec), Secret)
		}
	}
	if len(pairs) == 0 {
		return nil
	}
	return &Hider{r: strings.NewReplacer(pairs...)}
}

// Hide returns s with the secrets hidden.
func (h *Hider) Hide(s string) string {
	if h == nil || h.r == nil {
		return s
	}
	return h.r.Replace(s)
}

// Scrub returns msg with the secrets of the URLs raws hidden (a Hider of
// raws, for one message).
func Scrub(msg string, raws ...string) string { return NewHider(raws, nil).Hide(msg) }

// hidingHandler is a slog.Handler that hides secrets in the message and
// in the string and error values of the attributes before h sees them.
type hidingHandler struct {
	h  slog.Handler
	hd *Hider
}

// Logger returns l, or l through a handler that hides the secrets of hd
// in messages and in the strings and errors of attributes, when hd hides
// something.
func Logger(l *slog.Logger, hd *Hider) *slog.Logger {
	if hd == nil {
		return l
	}
	return slog.New(&hidingHandler{h: l.Handler(), hd: hd})
}

func (h *hidingHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.h.Enabled(ctx, l) }

func (h *hidingHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, h.hd.Hide(r.Message), r.PC)
	r.Attrs(func(a slog.Attr) bool {
		out.AddAttrs(h.attr(a))
		return true
	})
	return h.h.Handle(ctx, out)
}

func (h *hidingHandler) WithAttrs(as []slog.Attr) slog.Handler {
	hidden := make([]slog.Attr, len(as))
	for i, a := range as {
		hidden[i] = h.attr(a)
	}
	return &hidingHandler{h: h.h.WithAttrs(hidden), hd: h.hd}
}

func (h *hidingHandler) WithGroup(name string) slog.Handler {
	return &hidingHandler{h: h.h.WithGroup(name), hd: h.hd}
}

// attr returns a with its strings hidden: strings, errors and Stringers
// become hidden strings; groups are walked; other values pass as they are.
func (h *hidingHandler) attr(a slog.Attr) slog.Attr {
	v := a.Value.Resolve()
	switch v.Kind() {
	case slog.KindString:
		return slog.String(a.Key, h.hd.Hide(v.String()))
	case slog.KindGroup:
		g := v.Group()
		hidden := make([]slog.Attr, len(g))
		for i, ga := range g {
			hidden[i] = h.attr(ga)
		}
		return slog.Attr{Key: a.Key, Value: slog.GroupValue(hidden...)}
	case slog.KindAny:
		switch x := v.Any().(type) {
		case error:
			return slog.String(a.Key, h.hd.Hide(x.Error()))
		case fmt.Stringer:
			return slog.String(a.Key, h.hd.Hide(x.String()))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
