package idemgrpc

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	spb "google.golang.org/genproto/googleapis/rpc/status"
)

// outcome is what a call answered, as it is stored: the response message
// (its full type name and its deterministic encoding) or the error's
// status, and the header and trailer metadata the handler set.
type outcome struct {
	typeName string
	message  []byte
	status   *spb.Status // nil for a response
	header   metadata.MD
	trailer  metadata.MD
}

// The stored form: a version byte, then protobuf fields.
const (
	recordVersion = 1

	fieldType    = 1
	fieldMessage = 2
	fieldStatus  = 3
	fieldHeader  = 4 // repeated: key, 0, value
	fieldTrailer = 5 // repeated: key, 0, value
)

var errBadRecord = errors.New("idemgrpc: stored outcome cannot be decoded")

func (o *outcome) encode() ([]byte, error) {
	var sb []byte
	size := 1
	if o.status != nil {
		var err error
		if sb, err = deterministic.Marshal(o.status); err != nil {
			return nil, fmt.Errorf("idemgrpc: encoding the status: %w", err)
		}
		size += fieldSize(fieldStatus, len(sb))
	} else {
		size += fieldSize(fieldType, len(o.typeName)) + fieldSize(fieldMessage, len(o.message))
	}
	size += mdSize(fieldHeader, o.header) + mdSize(fieldTrailer, o.trailer)
	b := make([]byte, 1, size) // the record's one allocation
	b[0] = recordVersion
	if o.status != nil {
		b = protowire.AppendTag(b, fieldStatus, protowire.BytesType)
		b = protowire.AppendBytes(b, sb)
	} else {
		b = protowire.AppendTag(b, fieldType, protowire.BytesType)
		b = protowire.AppendString(b, o.typeName)
		b = protowire.AppendTag(b, fieldMessage, protowire.BytesType)
		b = protowire.AppendBytes(b, o.message)
	}
	b = appendMD(b, fieldHeader, o.header)
	b = appendMD(b, fieldTrailer, o.trailer)
	return b, nil
}

// fieldSize is the encoded size of a bytes field of n bytes.
func fieldSize(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeBytes(n)
}

func mdSize(field protowire.Number, md metadata.MD) int {
	n := 0
	for k, vs := range md {
		for _, v := range vs {
			n += fieldSize(field, len(k)+1+len(v))
		}
	}
	return n
}

func appendMD(b []byte, field protowire.Number, md metadata.MD) []byte {
	for k, vs := range md {
		for _, v := range vs {
			b = protowire.AppendTag(b, field, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(len(k)+1+len(v)))
			b = append(b, k...)
			b = append(b, 0)
			b = append(b, v...)
		}
	}
	return b
}

func decodeOutcome(b []byte) (outcome, error) {
	var o outcome
	if len(b) == 0 || b[0] != recordVersion {
		return o, errBadRecord
	}
	b = b[1:]
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return o, errBadRecord
		}
		b = b[n:]
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return o, errBadRecord
		}
		b = b[n:]
		switch num {
		case fieldType:
			o.typeName = string(v)
		case fieldMessage:
			o.message = v
		case fieldStatus:
			o.status = &spb.Status{}
			if err := proto.Unmarshal(v, o.status); err != nil {
				return o, fmt.Errorf("%w: %v", errBadRecord, err)
			}
		case fieldHeader, fieldTrailer:
			k, val, ok := strings.Cut(string(v), "\x00")
			if !ok {
				return o, errBadRecord
			}
			md := &o.header
			if num == fieldTrailer {
				md = &o.trailer
			}
			if *md == nil {
				*md = metadata.MD{}
			}
			(*md)[k] = append((*md)[k], val)
		}
	}
	return o, nil
}

// response returns the stored response message, of the type it was
// stored with, found in the registry of generated types
// (protoregistry.GlobalTypes).
func (o *outcome) response() (proto.Message, error) {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(o.typeName))
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: the stored response's type %q: %w", o.typeName, err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(o.message, m); err != nil {
		return nil, fmt.Errorf("%w: %v", errBadRecord, err)
	}
	return m, nil
}
