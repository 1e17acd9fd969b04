package h2_test

import (
	"fmt"
	"testing"
	"time"

	"golang.org/x/net/http2"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/server"
	"github.com/sharelimit/sharelimit/server/h2"
)

// TestRelayedCallsWithinTheStreamLimitAreNotRefused: a client that keeps
// exactly MaxConcurrentStreams relayed calls in flight, opening a new one as
// each ends, never exceeds the limit it was given, so none may be refused.
// A relayed call still counts against the limit after its trailers while
// its goroutines end (the defence against rapid reset), so the server must
// wait for them rather than refuse.
func TestRelayedCallsWithinTheStreamLimitAreNotRefused(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			d := start(t, direct, server.Options{})
			c := dialRaw(t, d.addr)
			c.nc.SetDeadline(time.Now().Add(2 * time.Minute))
			c.fr.WriteWindowUpdate(0, 1<<30) // room for every answer
			body, _ := proto.Marshal(&healthpb.HealthCheckRequest{Service: "ratelimit"})
			msg := grpcMsg(body)
			next := uint32(1)
			open := func() {
				c.headers(next, "/grpc.health.v1.Health/Check", false)
				if err := c.fr.WriteData(next, true, msg); err != nil {
					t.Fatal(err)
				}
				next += 2
			}
			for range h2.MaxConcurrentStreams {
				open()
			}
			const calls = 20000
			ended, refused := 0, 0
			for ended < calls {
				f, err := c.fr.ReadFrame()
				if err != nil {
					t.Fatalf("after %d calls: %v", ended, err)
				}
				done := false
				switch f := f.(type) {
				case *http2.MetaHeadersFrame:
					done = f.StreamEnded()
				case *http2.RSTStreamFrame:
					done = true
					if f.ErrCode == http2.ErrCodeRefusedStream {
						refused++
					}
				case *http2.SettingsFrame:
					if !f.IsAck() {
						c.fr.WriteSettingsAck()
					}
				}
				if done {
					ended++
					if int(next/2)+1 <= calls {
						open()
					}
				}
			}
			if refused > 0 {
				t.Fatalf("%d of %d calls refused, with never more than %d in flight", refused, calls, h2.MaxConcurrentStreams)
			}
		})
	}
}
