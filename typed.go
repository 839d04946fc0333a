package idem

import (
	"context"
	"encoding/json"
	"fmt"
)

// Codec turns Go values into stored results and back.
type Codec interface {
	Marshal(v any) ([]byte, error)
	Unmarshal(data []byte, v any) error
}

// JSONCodec is the Codec used by Typed when none is set: encoding/json's
// Marshal and Unmarshal.
var JSONCodec Codec = jsonCodec{}

// jsonCodec is JSONCodec's type.
type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error)      { return json.Marshal(v) }
func (jsonCodec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

// Typed runs operations that return a Go value of type T through an Executor,
// storing the value with Codec (JSONCodec when nil). The zero Codec works;
// Executor must be set.
type Typed[T any] struct {
	Executor *Executor
	Codec    Codec
}

// Do is Executor.Do for a value of type T: it returns fn's value, or the
// stored one decoded, and whether it was replayed. opts are passed to
// Executor.Do.
func (t Typed[T]) Do(ctx context.Context, key Key, fingerprint string, fn func(ctx context.Context) (T, error), opts ...CallOption) (v T, replayed bool, err error) {
	if fn == nil {
		return v, false, invalidf("nil function")
	}
	codec := t.Codec
	if codec == nil {
		codec = JSONCodec
	}
	var marshalErr error
	res, err := t.Executor.Do(ctx, key, fingerprint, func(ctx context.Context) ([]byte, error) {
		out, err := fn(ctx)
		if err != nil {
			return nil, err
		}
		v = out
		b, err := codec.Marshal(out)
		if err != nil {
			// The operation ran; its value cannot be stored. Storing the
			// failure keeps a retry from running it twice.
			marshalErr = err
			return nil, Terminal(fmt.Errorf("idem: encoding result: %w", err))
		}
		return b, nil
	}, opts...)
	if marshalErr != nil {
		return v, false, err
	}
	if err != nil || !res.Replayed {
		return v, false, err
	}
	if err := codec.Unmarshal(res.Value, &v); err != nil {
		return v, true, fmt.Errorf("%w: decoding %T: %v", ErrCorruptResult, v, err)
	}
	return v, true, nil
}
