package idem

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"testing"
)

// FuzzBlob checks that any stored bytes decode to a value or a clean error,
// never a panic or an unbounded allocation, and that encoding round-trips.
func FuzzBlob(f *testing.F) {
	block, _ := aes.NewCipher(make([]byte, 16))
	aead, _ := cipher.NewGCM(block)
	codecs := []*blobCodec{
		{compressAbove: 8, maxSize: 1 << 16},
		{compressAbove: -1, maxSize: 1 << 16},
		{compressAbove: 8, maxSize: 1 << 16, aead: aead},
	}
	f.Add([]byte{0, 'h', 'i'})
	f.Add([]byte{1, 0xff})
	f.Add([]byte{3})
	f.Add(bytes.Repeat([]byte("abc"), 100))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, c := range codecs {
			if v, err := c.decode("key", data); err == nil && len(v) > c.maxSize {
				t.Fatalf("decoded %d bytes, over the limit %d", len(v), c.maxSize)
			}
			if len(data) > c.maxSize {
				continue
			}
			blob, err := c.encode("key", data)
			if err != nil {
				t.Fatal(err)
			}
			got, err := c.decode("key", blob)
			if err != nil || !bytes.Equal(got, data) {
				t.Fatalf("round trip: got %q, %v, want %q", got, err, data)
			}
			if c.aead != nil {
				if _, err := c.decode("other key", blob); err == nil {
					t.Fatal("a sealed result decoded under another key")
				}
			}
		}
	})
}
