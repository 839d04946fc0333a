// Package delivery translates the messages of the brokers that `idem
// consume` reads into sidecar.Delivery (the HTTP request the handler
// gets), and finds their idempotency keys where --key says.
package delivery

import (
	"strings"

	"github.com/idemgo/idem/cmd/idem/internal/cli"
	"github.com/idemgo/idem/consumer"
	"github.com/idemgo/idem/keysource"
)

// KeySpec is consume's --key: where a message's idempotency key is.
type KeySpec struct {
	spec   string
	byID   bool                  // id: the broker's message ID
	src    keysource.Source      // header:NAME, json:POINTER
	hashed keysource.Fingerprint // hash:POINTER,...: the SHA-256 of those members
}

// ParseKeySpec parses --key: "" (the adapter's default), id,
// header:NAME, json:POINTER (package keysource) or hash:POINTER,POINTER…
// (consumer.HashKey of those members of a JSON body, as keysource's
// fingerprint selects them).
func ParseKeySpec(spec string) (KeySpec, error) {
	k := KeySpec{spec: spec}
	switch {
	case spec == "":
	case spec == "id":
		k.byID = true
	case strings.HasPrefix(spec, "hash:"):
		fp, err := keysource.ParseFingerprint("json:" + strings.TrimPrefix(spec, "hash:"))
		if err != nil {
			return k, cli.Usagef("invalid --key %q: %v", spec, err)
		}
		k.hashed = fp
	default:
		src, err := keysource.Parse(spec)
		if err != nil {
			return k, cli.Usagef("invalid --key %q: want id, header:NAME, json:POINTER or hash:POINTER,POINTER…: %v", spec, err)
		}
		k.src = src
	}
	return k, nil
}

// IsDefault reports whether --key leaves the adapter's default.
func (k KeySpec) IsDefault() bool { return k.spec == "" }

// Header returns the header NAME of header:NAME, or "".
func (k KeySpec) Header() string { return k.src.Header() }

// HeaderOr returns the header NAME of header:NAME, or else def (the
// adapter's default key header).
func (k KeySpec) HeaderOr(def string) string {
	if h := k.Header(); h != "" {
		return h
	}
	return def
}

// Key returns the key of a message with the given header getter, body and
// broker ID; "" for none (the message is dead-lettered, consumer.ErrNoKey).
func (k KeySpec) Key(header func(string) []string, body []byte, id string) string {
	switch {
	case k.byID:
		return id
	case !k.src.IsZero():
		key, err := k.src.Key(header, body)
		if err != nil {
			return ""
		}
		return key
	}
	sel := k.hashed.AppendBody(nil, body)
	if len(sel) == 0 || sel[0] == 0xff || strings.Trim(string(sel), "\x00") == "" {
		return "" // not JSON, or none of the members
	}
	return consumer.HashKey(string(sel))
}
