package main

import (
	"context"
	"fmt"
	"log/slog"
	"net/url"
	"strconv"
	"strings"
)

// Every message and log line that may show a URL given on the command line
// (--redis, --redis-cluster, --postgres, --upstream, --otel-endpoint, and
// any flag added later that takes one) shows it through redactURL. Beyond
// that, the flags that take a URL or a password are registered as such
// (flagSet.URL, flagSet.Password), and what a command prints passes
// through a hider made of their values: the error of every command (run),
// doctor's lines, relay's, and the proxy's log. An error of a client
// library that quotes the URL, or the password alone, decoded or not, is
// covered that way.

// redactedSecret stands for a hidden secret.
const redactedSecret = "xxxxx"

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
	if !strings.Contains(s, "://") && isKeywordValue(s) {
		return keywordSpans(s)
	}
	var out []textPart
	add := func(start, end int) {
		if end > start {
			out = append(out, textPart{start, end})
		}
	}
	start := 0
	if i := strings.Index(s, "://"); i >= 0 {
		start = i + 3
	}
	rest := s[start:]
	authEnd := len(rest)
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		authEnd = i
	}
	// The user information is what precedes the last @ of the authority.
	if at := strings.LastIndexByte(rest[:authEnd], '@'); at > 0 {
		info := rest[:at]
		if i := strings.IndexByte(info, ':'); i >= 0 {
			add(start+i+1, start+at)
		} else if !isPostgres(s) {
			add(start, start+at)
		}
	}
	q := strings.IndexByte(s, '?')
	if q < 0 || q < start+authEnd {
		return out
	}
	end := len(s)
	if i := strings.IndexByte(s[q:], '#'); i >= 0 {
		end = q + i
	}
	for pos := q + 1; pos < end; {
		next := strings.IndexByte(s[pos:end], '&')
		if next < 0 {
			next = end - pos
		}
		name, _, hasValue := strings.Cut(s[pos:pos+next], "=")
		if hasValue && secretName(name) {
			add(pos+len(name)+1, pos+next)
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

// isKeywordValue reports whether s reads as a Postgres keyword/value
// connection string: its first word is keyword=value.
func isKeywordValue(s string) bool {
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
	i := 0
	skip := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r') {
			i++
		}
	}
	for {
		skip()
		if i >= len(s) {
			return out
		}
		k := i
		for i < len(s) && s[i] != '=' && s[i] != ' ' {
			i++
		}
		name := s[k:i]
		skip()
		if i >= len(s) || s[i] != '=' {
			continue // not keyword=value: a word to step over
		}
		i++
		skip()
		var v textPart
		if i < len(s) && s[i] == '\'' {
			i++
			v.start = i
			for i < len(s) && s[i] != '\'' {
				if s[i] == '\\' {
					i++
				}
				i++
			}
			v.end = min(i, len(s))
			i++
		} else {
			v.start = i
			for i < len(s) && s[i] != ' ' && s[i] != '\t' && s[i] != '\n' {
				i++
			}
			v.end = i
		}
		if secretName(name) && v.end > v.start {
			out = append(out, v)
		}
	}
}

// redactURL returns the URL (or connection string) s with each secret
// secretSpans finds replaced by xxxxx: redis://user:xxxxx@host,
// https://xxxxx@host, postgres://u@h/db?password=xxxxx,
// host=h password=xxxxx.
func redactURL(s string) string {
	spans := secretSpans(s)
	if len(spans) == 0 {
		return s
	}
	var b strings.Builder
	last := 0
	for _, sp := range spans {
		b.WriteString(s[last:sp.start])
		b.WriteString(redactedSecret)
		last = sp.end
	}
	b.WriteString(s[last:])
	return b.String()
}

// hider hides, in any text, the secrets of the URLs and passwords given on
// the command line. The zero value and nil hide nothing.
type hider struct{ r *strings.Replacer }

// newHider returns the hider of urls (each hidden as redactURL shows it,
// as given and as %q quotes it, and each of its secrets wherever it
// appears, as given and decoded) and passwords (wherever they appear).
func newHider(urls, passwords []string) *hider {
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
		red := redactURL(raw)
		add(raw, red)
		add(quoted(raw), quoted(red))
		for _, sp := range spans {
			secrets = append(secrets, raw[sp.start:sp.end])
		}
	}
	secrets = append(secrets, passwords...)
	for _, sec := range secrets {
		add(sec, redactedSecret)
		add(quoted(sec), redactedSecret)
		if u, err := url.QueryUnescape(sec); err == nil {
			add(u, redactedSecret)
			add(quoted(u), redactedSecret)
		}
		if u, err := url.PathUnescape(sec); err == nil {
			add(u, redactedSecret)
		}
		if strings.Contains(sec, `\`) { // a quoted keyword value: \' and \\
			add(strings.NewReplacer(`\'`, `'`, `\\`, `\`).Replace(sec), redactedSecret)
		}
	}
	if len(pairs) == 0 {
		return nil
	}
	return &hider{r: strings.NewReplacer(pairs...)}
}

// hide returns s with the secrets hidden.
func (h *hider) hide(s string) string {
	if h == nil || h.r == nil {
		return s
	}
	return h.r.Replace(s)
}

// scrub returns msg with the secrets of the URLs raws hidden (a hider of
// raws, for one message).
func scrub(msg string, raws ...string) string { return newHider(raws, nil).hide(msg) }

// urlFlagError is the usage error of a URL flag whose value err rejects:
// the value and the error without its secrets, and a hint when the value
// lacks a scheme (a bare host:port), which the URL parsers read oddly; a
// Postgres keyword/value string needs none.
func urlFlagError(flag, raw string, err error, scheme string) error {
	hint := ""
	if !strings.Contains(raw, "://") && !(scheme == "postgres" && isKeywordValue(raw)) {
		hint = "; add the scheme: " + flag + " " + scheme + "://" + redactURL(raw)
	}
	return usagef("invalid %s URL %q: %s%s", flag, redactURL(raw), scrub(err.Error(), raw), hint)
}

// hidingHandler is a slog.Handler that hides secrets in the message and
// in the string and error values of the attributes before h sees them.
type hidingHandler struct {
	h  slog.Handler
	hd *hider
}

// hidingLogger returns l, or l through a hidingHandler when hd hides
// something.
func hidingLogger(l *slog.Logger, hd *hider) *slog.Logger {
	if hd == nil {
		return l
	}
	return slog.New(&hidingHandler{h: l.Handler(), hd: hd})
}

func (h *hidingHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.h.Enabled(ctx, l) }

func (h *hidingHandler) Handle(ctx context.Context, r slog.Record) error {
	out := slog.NewRecord(r.Time, r.Level, h.hd.hide(r.Message), r.PC)
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
		return slog.String(a.Key, h.hd.hide(v.String()))
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
			return slog.String(a.Key, h.hd.hide(x.Error()))
		case fmt.Stringer:
			return slog.String(a.Key, h.hd.hide(x.String()))
		}
	}
	return slog.Attr{Key: a.Key, Value: v}
}
