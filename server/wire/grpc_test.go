package wire

import (
	"context"
	"fmt"
	"net"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
)

// echoRLS answers each descriptor with a status naming its entries, so the
// client sees exactly what the server decoded; a domain of "metadata" adds
// dynamic metadata, which only the fallback writes.
type echoRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (echoRLS) ShouldRateLimit(_ context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for _, d := range req.Descriptors {
		name := req.Domain
		for _, e := range d.Entries {
			name += "|" + e.Key + "=" + e.Value
		}
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{
			Code:               rlsv3.RateLimitResponse_OK,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: req.HitsAddend},
			LimitRemaining:     uint32(len(d.Entries)),
			DurationUntilReset: durationpb.New(1500),
		})
	}
	if req.Domain == "metadata" {
		resp.DynamicMetadata, _ = structpb.NewStruct(map[string]any{"k": "v"})
	}
	return resp, nil
}

// TestCodecThroughGRPC serves RLS and health on a server with the codec, and
// calls both through a real client on the default codec.
func TestCodecThroughGRPC(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer(ServerOption())
	rlsv3.RegisterRateLimitServiceServer(s, echoRLS{})
	healthpb.RegisterHealthServer(s, health.NewServer())
	go s.Serve(lis)
	t.Cleanup(s.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	client := rlsv3.NewRateLimitServiceClient(conn)
	for _, domain := range []string{"edge", "metadata"} {
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: 4}
		for range 5 { // past the block
			req.Descriptors = append(req.Descriptors, desc("remote_address=10.0.0.1", "path=/a"), &commonv3.RateLimitDescriptor{})
		}
		resp, err := client.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := echoRLS{}.ShouldRateLimit(context.Background(), req)
		if !proto.Equal(resp, want) {
			t.Fatalf("domain %s:\n got %v\nwant %v", domain, resp, want)
		}
	}
	if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health through the fallback: %v", err)
	}
}

// TestUnmarshalShortAndLong decodes through the codec's entry point a request
// that fits its block and one that does not, split over several buffers as
// grpc-go may pass them.
func TestUnmarshalShortAndLong(t *testing.T) {
	c := NewCodec()
	for _, n := range []int{1, 3, 40} {
		req := &rlsv3.RateLimitRequest{Domain: "edge"}
		for i := range n {
			req.Descriptors = append(req.Descriptors, desc(fmt.Sprintf("remote_address=10.0.0.%d", i)))
		}
		raw := marshal(t, req)
		var data mem.BufferSlice
		for len(raw) > 0 {
			k := min(len(raw), 7)
			data = append(data, mem.SliceBuffer(raw[:k]))
			raw = raw[k:]
		}
		got := new(rlsv3.RateLimitRequest)
		if err := c.Unmarshal(data, got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, req) {
			t.Fatalf("%d descriptors:\n got %v\nwant %v", n, got, req)
		}
	}
}
