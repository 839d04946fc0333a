package idemgrpc

import (
	"reflect"
	"testing"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	spb "google.golang.org/genproto/googleapis/rpc/status"
)

// TestRecordRoundTrip: an outcome (a response or a status, with header and
// trailer metadata of several values) decodes to what was encoded, and its
// record is sized before it is written: one allocation, no growth.
func TestRecordRoundTrip(t *testing.T) {
	md := metadata.MD{"x-a": {"1", "2"}, "x-b-bin": {"\x00\xff"}}
	for _, o := range []outcome{
		{typeName: "google.protobuf.StringValue", message: []byte{10, 2, 'h', 'i'}, header: md, trailer: metadata.MD{"x-sum": {"s"}}},
		{status: &spb.Status{Code: 9, Message: "no"}, trailer: md},
		{typeName: "google.protobuf.Empty"},
	} {
		b, err := o.encode()
		if err != nil {
			t.Fatal(err)
		}
		if len(b) != cap(b) {
			t.Errorf("record of %d bytes in a buffer of %d", len(b), cap(b))
		}
		got, err := decodeOutcome(b)
		if err != nil {
			t.Fatal(err)
		}
		if got.typeName != o.typeName || string(got.message) != string(o.message) || !proto.Equal(got.status, o.status) ||
			!reflect.DeepEqual(got.header, o.header) || !reflect.DeepEqual(got.trailer, o.trailer) {
			t.Errorf("got %+v, want %+v", got, o)
		}
	}
}
