package wire

import (
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

func benchRequest(n int) *rlsv3.RateLimitRequest {
	req := &rlsv3.RateLimitRequest{Domain: "edge"}
	for range n {
		req.Descriptors = append(req.Descriptors, desc("remote_address=10.1.2.3"))
	}
	return req
}

// benchResponse is the answer to benchRequest(n).
func benchResponse(n int) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for range n {
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: "edge.remote_address", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
			LimitRemaining:     42,
			DurationUntilReset: &durationpb.Duration{Nanos: 10_000_000},
		})
	}
	return resp
}

// BenchmarkDecode decodes a request of 1 and of 10 descriptors into a fresh
// message, as grpc-go hands it over: by the codec (the daemon's path) and by
// the protobuf runtime.
func BenchmarkDecode(b *testing.B) {
	c := NewCodec()
	for _, n := range []int{1, 10} {
		raw := marshal(b, benchRequest(n))
		data := mem.BufferSlice{mem.SliceBuffer(raw)}
		b.Run(name(n)+"/wire", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req := new(rlsv3.RateLimitRequest)
				if err := c.Unmarshal(data, req); err != nil || len(req.Descriptors) != n {
					b.Fatal(err)
				}
			}
		})
		b.Run(name(n)+"/proto", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				req := new(rlsv3.RateLimitRequest)
				if err := proto.Unmarshal(raw, req); err != nil || len(req.Descriptors) != n {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEncode writes the answer to it, into a reused buffer by hand (the
// pool's part) and by proto.Marshal as grpc-go's codec calls it.
func BenchmarkEncode(b *testing.B) {
	for _, n := range []int{1, 10} {
		resp := benchResponse(n)
		b.Run(name(n)+"/wire", func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 1024)
			for b.Loop() {
				buf = AppendResponse(buf[:0], resp)
			}
		})
		b.Run(name(n)+"/proto", func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := (proto.MarshalOptions{UseCachedSize: true}).Marshal(resp); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func name(n int) string {
	if n == 1 {
		return "1-descriptor"
	}
	return "10-descriptors"
}

// BenchmarkCodecMarshal is the codec's whole Marshal as grpc-go calls it,
// buffers handed back (Free) as grpc-go does once they are written.
func BenchmarkCodecMarshal(b *testing.B) {
	c := NewCodec()
	for _, n := range []int{1, 10} {
		resp := benchResponse(n)
		b.Run(name(n), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					data, err := c.Marshal(resp)
					if err != nil {
						b.Fatal(err)
					}
					data.Free()
				}
			})
		})
	}
}
