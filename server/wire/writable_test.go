package wire

import (
	"bytes"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// TestMarshalTypedNil: a handler returning a nil *RateLimitResponse with
// a nil error reaches the codec as a typed nil. grpc-go's proto codec writes
// an empty message; the codec must not panic (a panic there is outside any
// handler's recover and ends the process).
func TestMarshalTypedNil(t *testing.T) {
	var resp *rlsv3.RateLimitResponse
	want, err := encoding.GetCodecV2("proto").Marshal(resp)
	if err != nil {
		t.Fatalf("proto codec: %v", err)
	}
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("Codec.Marshal(typed nil) panics: %v (proto codec writes %d bytes)", p, want.Len())
		}
	}()
	got, err := NewCodec().Marshal(resp)
	if err != nil || !bytes.Equal(got.Materialize(), want.Materialize()) {
		t.Fatalf("got %x, %v; want %x", got.Materialize(), err, want.Materialize())
	}
}

// TestWritableMeansSameBytes: whenever Writable is true, the bytes are
// proto.Marshal's (and proto.Marshal succeeds).
func TestWritableMeansSameBytes(t *testing.T) {
	unknown := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	unknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
	statusUnknown := &rlsv3.RateLimitResponse{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK}}}
	statusUnknown.Statuses[0].ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 1))
	for name, resp := range map[string]*rlsv3.RateLimitResponse{
		"unknown fields":                {OverallCode: rlsv3.RateLimitResponse_OK},
		"unknown fields on the message": unknown,
		"unknown fields on a status":    statusUnknown,
		"invalid UTF-8 header value":    {ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "x", Value: "\xff"}}},
		"invalid UTF-8 limit name": {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "a\xc3"}}}},
	} {
		if !Writable(resp) {
			continue
		}
		want, err := proto.Marshal(resp)
		got := AppendResponse(nil, resp)
		if err != nil {
			t.Errorf("%s: Writable, AppendResponse writes %x, proto.Marshal fails: %v", name, got, err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: Writable, AppendResponse writes %x, proto.Marshal %x", name, got, want)
		}
	}
}

// TestCodecMarshalBothPaths: small answers are allocated, larger ones pooled
// (poolFrom); both carry proto.Marshal's bytes.
func TestCodecMarshalBothPaths(t *testing.T) {
	c := NewCodec()
	for _, n := range []int{1, 40} {
		resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}
		for range n {
			resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT,
				CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "edge.remote_address", RequestsPerUnit: 7}})
		}
		want, _ := proto.Marshal(resp)
		if small := len(want) < poolFrom; small != (n == 1) {
			t.Fatalf("%d statuses: %d bytes, not on the path meant", n, len(want))
		}
		data, err := c.Marshal(resp)
		if err != nil || !bytes.Equal(data.Materialize(), want) {
			t.Fatalf("%d statuses: %x, %v; want %x", n, data.Materialize(), err, want)
		}
		data.Free()
	}
}

// TestAppendSizedWrongly: an answer that takes fewer bytes than it was sized
// for, as one changed after its sizing would, is not written.
func TestAppendSizedWrongly(t *testing.T) {
	resp := benchResponse(2)
	n := ResponseSize(resp)
	if b, ok := appendSized([]byte("prefix"), resp, n+1); ok || string(b) != "prefix" {
		t.Fatalf("sized one byte over: ok %t, %q", ok, b)
	}
	if b, ok := appendSized([]byte("prefix"), resp, n); !ok || len(b) != len("prefix")+n {
		t.Fatalf("sized right: ok %t, %d bytes", ok, len(b))
	}
}
