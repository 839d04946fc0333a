package sidecar

import (
	"context"
	"encoding/base64"
	"net/http"
	"slices"
	"strconv"
	"sync"

	"github.com/idemgo/idem/consumer"
)

// resultBufs holds the buffers results are encoded into before
// consumer.SetResult copies them.
var resultBufs = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// setResult stores r as the key's result of the message of ctx
// (consumer.SetResult), encoded as encoding/json writes a Result.
func setResult(ctx context.Context, r *Result) {
	bp := resultBufs.Get().(*[]byte)
	*bp = r.appendJSON((*bp)[:0])
	consumer.SetResult(ctx, *bp)
	if cap(*bp) <= 64<<10 {
		resultBufs.Put(bp)
	}
}

// appendJSON appends r as JSON, byte for byte what encoding/json.Marshal
// writes for it (TestResultJSON), without its reflection and its copy.
func (r *Result) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"status":`...)
	dst = strconv.AppendInt(dst, int64(r.Status), 10)
	if len(r.Header) > 0 {
		dst = append(dst, `,"header":`...)
		dst = appendHeaderJSON(dst, r.Header)
	}
	if len(r.Body) > 0 {
		dst = append(dst, `,"body":"`...)
		dst = base64.StdEncoding.AppendEncode(dst, r.Body)
		dst = append(dst, '"')
	}
	if r.Truncated {
		dst = append(dst, `,"truncated":true`...)
	}
	if r.Gate {
		dst = append(dst, `,"gate":true`...)
	}
	return append(dst, '}')
}

// appendHeaderJSON appends h as encoding/json writes a map of string
// slices: its names sorted, a nil slice as null.
func appendHeaderJSON(dst []byte, h http.Header) []byte {
	var arr [8]string
	names := arr[:0]
	for k := range h {
		names = append(names, k)
	}
	slices.Sort(names)
	dst = append(dst, '{')
	for n, k := range names {
		if n > 0 {
			dst = append(dst, ',')
		}
		dst = appendJSONString(dst, k)
		dst = append(dst, ':')
		vs := h[k]
		if vs == nil {
			dst = append(dst, "null"...)
			continue
		}
		dst = append(dst, '[')
		for i, v := range vs {
			if i > 0 {
				dst = append(dst, ',')
			}
			dst = appendJSONString(dst, v)
		}
		dst = append(dst, ']')
	}
	return append(dst, '}')
}
