package wire

import (
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"

	// The protobuf codec this one falls back to registers itself on import.
	_ "google.golang.org/grpc/encoding/proto"
)

// Codec is the gRPC codec: RLS requests and answers by hand, everything else
// by grpc-go's protobuf codec. Safe for concurrent use.
type Codec struct {
	fallback encoding.CodecV2
	pool     mem.BufferPool
}

var _ encoding.CodecV2 = (*Codec)(nil)

// NewCodec returns the codec, falling back to the protobuf codec registered
// with grpc-go.
func NewCodec() *Codec {
	fb := encoding.GetCodecV2("proto")
	if fb == nil {
		panic("wire: grpc-go's proto codec is not registered")
	}
	return &Codec{fallback: fb, pool: mem.DefaultBufferPool()}
}

// ServerOption installs the codec on a gRPC server.
func ServerOption() grpc.ServerOption { return grpc.ForceServerCodecV2(NewCodec()) }

// Name is the content subtype the codec serves: the protobuf one.
func (c *Codec) Name() string { return "proto" }

// poolFrom is the smallest answer written into a pooled buffer, measured
// (BenchmarkCodecMarshal): one descriptor's answer, about 40 bytes, took 375
// ns through the pool and 142 allocated; ten descriptors' (about 400 bytes)
// 640 ns through the pool and 820 allocated. grpc-go's own codec pools from
// 1 KiB.
const poolFrom = 256

// Marshal writes an answer into a pooled buffer, or hands any other message to
// the fallback.
func (c *Codec) Marshal(v any) (mem.BufferSlice, error) {
	resp, ok := v.(*rlsv3.RateLimitResponse)
	if !ok || !Writable(resp) {
		return c.fallback.Marshal(v)
	}
	n := ResponseSize(resp)
	if n < poolFrom {
		// A small answer costs less to allocate than to take from the
		// pool and give back.
		out, ok := appendSized(make([]byte, 0, n), resp, n)
		if !ok {
			return nil, errResized(n)
		}
		return mem.BufferSlice{mem.SliceBuffer(out)}, nil
	}
	buf := c.pool.Get(n)
	out, ok := appendSized((*buf)[:0], resp, n)
	if !ok {
		c.pool.Put(buf)
		return nil, errResized(n)
	}
	*buf = out
	return mem.BufferSlice{mem.NewBuffer(buf, c.pool)}, nil
}

// errResized is the error for an answer that changed between its sizing and
// its writing.
func errResized(n int) error {
	return fmt.Errorf("wire: answer encoded to fewer bytes than the %d it was sized", n)
}

// Unmarshal decodes a request, or hands any other message to the fallback.
func (c *Codec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		return c.fallback.Unmarshal(data, v)
	}
	// DecodeRequest keeps nothing pointing into what it is given: the
	// buffers grpc-go passes in go back to its pool when this returns.
	if len(data) == 1 {
		return DecodeRequest(data[0].ReadOnlyData(), req)
	}
	if n := data.Len(); n <= inlineBytes {
		// Split over buffers but short: copied once, into its block.
		blk := new(block)
		return decodeRequest(blk, blk.raw[:data.CopyTo(blk.raw[:n])], true, req)
	}
	return DecodeRequest(data.Materialize(), req)
}
