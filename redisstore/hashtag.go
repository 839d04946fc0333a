package redisstore

import (
	"fmt"
	"strings"

	"github.com/idemgo/idem"
)

// WithHashTag makes every record key of the store share the Cluster hash tag
// tag: records are stored at <prefix>{<tag>}{<digest>} (and notification
// channels at <prefix>{<tag>}{<digest>}:w). Redis Cluster hashes a key by
// its first non-empty {…} section, so all records of the store then live in
// one slot, on one primary: the store no longer spreads over the Cluster.
// That is the price of scripts that touch a record and another key at once,
// such as CompleteAndAck, which acknowledges a stream entry in the same
// script: the stream must carry the same tag (see CheckStream). Use one
// store per stream (or per set of streams with one tag).
//
// On a standalone server the tag only changes the key names. tag must be 1
// to 64 bytes without '{' or '}'. The default is no tag: each record is its
// own hash tag.
func WithHashTag(tag string) Option { return func(c *config) { c.hashTag = tag } }

func validateHashTag(tag string) error {
	if tag == "" {
		return nil
	}
	if len(tag) > 64 {
		return fmt.Errorf("%w: hash tag is %d bytes, over the limit of 64", idem.ErrInvalid, len(tag))
	}
	if strings.ContainsAny(tag, "{}") {
		return fmt.Errorf("%w: hash tag %q contains a brace", idem.ErrInvalid, tag)
	}
	return nil
}

func hashTagPart(tag string) string {
	if tag == "" {
		return ""
	}
	return "{" + tag + "}"
}

// HashTag returns the tag set with WithHashTag, or "".
func (s *Store) HashTag() string { return s.tag }

// KeyHashTag returns the Redis Cluster hash tag of key: the part between
// the first '{' and the first '}' after it, if that part is not empty; ""
// otherwise (the whole key is hashed).
func KeyHashTag(key string) string {
	open := strings.IndexByte(key, '{')
	if open < 0 {
		return ""
	}
	end := strings.IndexByte(key[open+1:], '}')
	if end <= 0 {
		return ""
	}
	return key[open+1 : open+1+end]
}

// CheckStream reports whether scripts can touch the stream (and its
// dead-letter stream dlq) and this store's records at once. When the store
// has a hash tag (WithHashTag), both names must carry the same tag. On a
// Cluster the store must have one: without it, records and streams live in
// different slots. On a standalone server without a tag any names work.
// A store configured with WithWait or WithWaitAOF is refused: the
// pipelined complete-and-ack calls do not wait for replicas. Errors wrap
// idem.ErrInvalid. CheckStream does no I/O.
func (s *Store) CheckStream(stream, dlq string) error {
	if stream == "" {
		return fmt.Errorf("%w: empty stream name", idem.ErrInvalid)
	}
	if s.wait != nil {
		return errBatchWait
	}
	if s.tag == "" {
		if s.isCluster() {
			return fmt.Errorf("%w: on a Redis Cluster the store needs WithHashTag(%q) to ack stream %q in the script that completes a record",
				idem.ErrInvalid, KeyHashTag(stream), stream)
		}
		return nil
	}
	for _, name := range []string{stream, dlq} {
		if got := KeyHashTag(name); got != s.tag {
			return fmt.Errorf("%w: stream %q has hash tag %q, want the store's %q (name it like \"{%s}…\")",
				idem.ErrInvalid, name, got, s.tag, s.tag)
		}
	}
	return nil
}

// isCluster reports whether the store runs on a Redis Cluster client.
func (s *Store) isCluster() bool { return s.b.Cluster() }
