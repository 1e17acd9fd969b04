package loadgen

import (
	"errors"
	"fmt"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"

	// The protobuf codec this one falls back to registers itself on import.
	_ "google.golang.org/grpc/encoding/proto"
)

// The load generator's own cost is part of every figure it reports when it
// shares the machine with the servers it measures, and a server that answers
// in a few microseconds leaves the client the larger part: with the protobuf
// runtime, a 10-descriptor call cost the client 46 µs of CPU against the
// daemon's 17. So requests are written by hand into each worker's reused
// buffer, and an answer is read only as far as the load generator uses it:
// overall_code, with every other field checked for well-formed framing and
// skipped. The bytes written are proto.Marshal's (TestRequestBytesAsProto).

// wireRequest is a request already encoded.
type wireRequest struct{ b []byte }

// answer is what the load generator reads of a RateLimitResponse.
type answer struct{ code rlsv3.RateLimitResponse_Code }

// clientCodec sends wireRequests and reads answers; any other message goes to
// grpc-go's protobuf codec. Safe for concurrent use.
type clientCodec struct{ fallback encoding.CodecV2 }

func newClientCodec() clientCodec {
	fb := encoding.GetCodecV2("proto")
	if fb == nil {
		panic("loadgen: grpc-go's proto codec is not registered")
	}
	return clientCodec{fallback: fb}
}

func (clientCodec) Name() string { return "proto" }

func (c clientCodec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*wireRequest); ok {
		return mem.BufferSlice{mem.SliceBuffer(r.b)}, nil
	}
	return c.fallback.Marshal(v)
}

func (c clientCodec) Unmarshal(data mem.BufferSlice, v any) error {
	a, ok := v.(*answer)
	if !ok {
		return c.fallback.Unmarshal(data, v)
	}
	if len(data) == 1 {
		return a.read(data[0].ReadOnlyData())
	}
	return a.read(data.Materialize())
}

var errMalformedAnswer = errors.New("loadgen: malformed RateLimitResponse")

// read takes overall_code from an encoded answer; the last value wins, as in
// proto.Unmarshal.
func (a *answer) read(b []byte) error {
	a.code = rlsv3.RateLimitResponse_UNKNOWN
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return fmt.Errorf("%w: %v", errMalformedAnswer, protowire.ParseError(n))
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return fmt.Errorf("%w: %v", errMalformedAnswer, protowire.ParseError(m))
			}
			a.code = rlsv3.RateLimitResponse_Code(int32(v))
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return fmt.Errorf("%w: %v", errMalformedAnswer, protowire.ParseError(m))
		}
		b = b[m:]
	}
	return nil
}

// appendRequest appends req as proto.Marshal writes it: fields by number,
// nothing for zero values. It writes the fields requestBuilder sets.
func appendRequest(b []byte, req *rlsv3.RateLimitRequest) []byte {
	if req.Domain != "" {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, req.Domain)
	}
	for _, d := range req.Descriptors {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(descriptorSize(d)))
		for _, e := range d.Entries {
			b = protowire.AppendTag(b, 1, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(entrySize(e)))
			b = appendStringField(b, 1, e.Key)
			b = appendStringField(b, 2, e.Value)
		}
	}
	if req.HitsAddend != 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(req.HitsAddend))
	}
	return b
}

func descriptorSize(d *ratelimitv3.RateLimitDescriptor) int {
	n := 0
	for _, e := range d.Entries {
		s := entrySize(e)
		n += protowire.SizeTag(1) + protowire.SizeBytes(s)
	}
	return n
}

func entrySize(e *ratelimitv3.RateLimitDescriptor_Entry) int {
	return stringFieldSize(1, e.Key) + stringFieldSize(2, e.Value)
}

func stringFieldSize(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeBytes(len(s))
}

func appendStringField(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return protowire.AppendString(b, s)
}
