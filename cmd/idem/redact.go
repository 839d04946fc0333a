package main

import (
	"strconv"
	"strings"
)

// Every message and log line that may show a URL given on the command line
// (--redis, --redis-cluster, --upstream, --otel-endpoint, and any flag
// added later that takes one) shows it through redactURL, and any error
// that may quote it (url.Parse's, the Redis client's) through scrub, so
// that a password never reaches a terminal or a log.

// redactedSecret stands for a hidden password.
const redactedSecret = "xxxxx"

// redactURL hides the password of the URL s, as url.URL.Redacted does
// (user:xxxxx@host), and the whole user information when it has no colon
// (a token in the user name). It works on strings that do not parse as a
// URL too, or parse as something else (host:port with a user:password@ in
// front reads as a scheme): the user information is found in the text, as
// what precedes the last @ of the authority.
func redactURL(s string) string {
	start, end, secret := userinfo(s)
	if secret == "" {
		return s
	}
	return s[:start] + strings.Replace(s[start:end], secret, redactedSecret, 1) + s[end:]
}

// userinfo returns the bounds of the user information of the URL s and
// the part of it to hide (the password, or all of it without a colon); ""
// if there is none.
func userinfo(s string) (start, end int, secret string) {
	if i := strings.Index(s, "://"); i >= 0 {
		start = i + 3
	}
	auth := s[start:]
	if i := strings.IndexAny(auth, "/?#"); i >= 0 {
		auth = auth[:i]
	}
	at := strings.LastIndexByte(auth, '@')
	if at < 0 {
		return 0, 0, ""
	}
	end = start + at
	info := s[start:end]
	secret = info
	if _, pw, ok := strings.Cut(info, ":"); ok {
		secret = pw
	}
	if secret == "" {
		return 0, 0, ""
	}
	return start, end, secret
}

// scrub returns msg with the secrets of the URLs raws hidden: each URL as
// given and as quoted by %q, and the secret itself wherever it appears
// (an error may quote only part of the URL).
func scrub(msg string, raws ...string) string {
	for _, raw := range raws {
		_, _, secret := userinfo(raw)
		if secret == "" {
			continue
		}
		red := redactURL(raw)
		msg = strings.ReplaceAll(msg, raw, red)
		if q := strconv.Quote(raw); q[1:len(q)-1] != raw {
			rq := strconv.Quote(red)
			msg = strings.ReplaceAll(msg, q[1:len(q)-1], rq[1:len(rq)-1])
		}
		msg = strings.ReplaceAll(msg, secret, redactedSecret)
	}
	return msg
}

// urlFlagError is the usage error of a URL flag whose value err rejects:
// the value and the error without its password, and a hint when the value
// lacks a scheme (a bare host:port), which the URL parsers read oddly.
func urlFlagError(flag, raw string, err error, scheme string) error {
	hint := ""
	if !strings.Contains(raw, "://") {
		hint = "; add the scheme: " + flag + " " + scheme + "://" + redactURL(raw)
	}
	return usagef("invalid %s URL %q: %s%s", flag, redactURL(raw), scrub(err.Error(), raw), hint)
}
