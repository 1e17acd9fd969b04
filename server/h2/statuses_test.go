package h2_test

import (
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/server"
	"github.com/sharelimit/sharelimit/server/h2"
)

// TestEdgeStatusesAsGRPCGo: requests no gRPC client sends, answered as
// grpc-go answers them: HTTP status, gRPC status and message.
func TestEdgeStatusesAsGRPCGo(t *testing.T) {
	req, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("free=x")}})
	slow, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("slow=a")}})
	cases := []struct {
		name string
		id   uint32 // the stream whose answer is compared
		run  func(c *rawClient)
	}{
		{"compressed flag, no grpc-encoding", 1, func(c *rawClient) {
			c.headers(1, h2.Path, false)
			m := grpcMsg(req)
			m[0] = 1
			c.fr.WriteData(1, true, m)
		}},
		{"grpc-timeout 0n on a call a wait policy holds", 3, func(c *rawClient) {
			c.headers(1, h2.Path, false) // empties the bucket of 1
			c.fr.WriteData(1, true, grpcMsg(slow))
			c.outcome(1, time.Second)
			c.headers(3, h2.Path, false, "grpc-timeout", "0n")
			c.fr.WriteData(3, true, grpcMsg(slow))
		}},
		{"no request message", 1, func(c *rawClient) {
			c.headers(1, h2.Path, true)
		}},
		{"no request message, empty DATA", 1, func(c *rawClient) {
			c.headers(1, h2.Path, false)
			c.fr.WriteData(1, true, nil)
		}},
		{"two request messages", 1, func(c *rawClient) {
			c.headers(1, h2.Path, false)
			c.fr.WriteData(1, true, append(grpcMsg(req), grpcMsg(req)...))
		}},
		{"a request cut short", 1, func(c *rawClient) {
			c.headers(1, h2.Path, false)
			c.fr.WriteData(1, true, grpcMsg(req)[:8])
		}},
		{"a prefix cut short", 1, func(c *rawClient) {
			c.headers(1, h2.Path, false)
			c.fr.WriteData(1, true, []byte{0, 0})
		}},
		{"gzip", 1, func(c *rawClient) {
			c.headers(1, h2.Path, false, "grpc-encoding", "gzip")
			c.fr.WriteData(1, true, grpcMsg(req))
		}},
		{"a message over the size cap", 1, func(c *rawClient) {
			c.headers(1, h2.Path, false)
			c.fr.WriteData(1, false, []byte{0, 0, 0x10, 0, 1})
		}},
		{"malformed grpc-timeout", 1, func(c *rawClient) {
			c.headers(1, h2.Path, false, "grpc-timeout", "1x")
			c.fr.WriteData(1, true, grpcMsg(req))
		}},
		{"status message over 1024 bytes (relayed)", 1, func(c *rawClient) {
			c.headers(1, "/"+strings.Repeat("a", 1500)+"/M", false)
			c.fr.WriteData(1, true, grpcMsg(nil))
		}},
	}
	for _, k := range cases {
		var got [2]string
		for i, direct := range []bool{true, false} {
			d := start(t, direct, server.Options{})
			c := dialRaw(t, d.addr)
			k.run(c)
			got[i] = c.outcome(k.id, 2*time.Second)
			c.nc.Close()
		}
		if got[0] != got[1] {
			t.Errorf("%s:\n direct:  %.160s (%d chars)\n grpc-go: %.160s (%d chars)", k.name, got[0], len(got[0]), got[1], len(got[1]))
		}
	}
}
