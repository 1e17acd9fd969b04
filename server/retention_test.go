package server

import (
	"context"
	"io"
	"log/slog"
	"runtime"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/server/wire"
	"github.com/sharelimit/sharelimit/source"
)

// TestOverLimitSamplesDoNotPinRequests: the status page's over-limit ring
// keeps the request's domain string. Decoded by the wire codec, that string
// points into the request's whole byte copy, so each of the 256 samples can
// pin up to MaxRecvMsgSize bytes for as long as it stays in the ring.
func TestOverLimitSamplesDoNotPinRequests(t *testing.T) {
	set, err := source.Load("testdata/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	store := bucket.NewStore(0)
	e := newEngine(t, nil, store, engine.Options{})
	metrics := NewMetrics(store)
	metrics.Bind(set)
	e.Swap(set)
	svc := NewService(e, func() int64 { return 1 }, metrics, Options{}, slog.New(slog.NewTextHandler(io.Discard, nil)))

	// An over-limit request ("fixed=one" allows 2 a second, the clock stands
	// still) padded with an unknown field to 512 KiB.
	base, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{d("fixed=one")}})
	raw := protowire.AppendBytes(protowire.AppendTag(base, 99, protowire.BytesType), make([]byte, 512<<10))

	codec := wire.NewCodec()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for range 8 * 300 {
		req := new(rlsv3.RateLimitRequest)
		if err := codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(raw)}, req); err != nil {
			t.Fatal(err)
		}
		if _, err := svc.ShouldRateLimit(context.Background(), req); err != nil {
			t.Fatal(err)
		}
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("live heap grew by %d MiB after the requests were answered", grown>>20)
	if grown > 16<<20 {
		t.Fatalf("answered requests keep %d MiB live (over-limit samples hold the request bytes)", grown>>20)
	}
	runtime.KeepAlive(metrics)
}
