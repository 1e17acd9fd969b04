package h2_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	rpb "google.golang.org/grpc/reflection/grpc_reflection_v1"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/server"
	"github.com/sharelimit/sharelimit/server/h2"
)

// TestAnswersDoNotWaitForTheNextFrame: what the frames read so far produce
// (answers, deadlines) must not wait for a frame that is still arriving. A
// link that delivers a request and the first bytes of the next frame in one
// segment, and the rest later, is what a busy or shaped uplink does; were the
// answer held until the rest came, it would reach Envoy after its deadline,
// its token spent. The client here sends the rest only once it has the
// answer, so a server that waits for it never answers.
func TestAnswersDoNotWaitForTheNextFrame(t *testing.T) {
	req, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("free=x")}})
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			d := start(t, direct, server.Options{})
			c := dialRaw(t, d.addr)
			// Frames written into a buffer, to be cut where a frame is
			// half-sent; the header blocks are the connection's own.
			var buf bytes.Buffer
			fr := http2.NewFramer(&buf, nil)
			headers := func(id uint32, extra ...string) {
				fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.block(h2.Path, extra...), EndHeaders: true})
			}
			headers(1)
			fr.WriteData(1, true, grpcMsg(req))
			headers(3, "grpc-timeout", "200m")
			fr.WriteData(3, true, grpcMsg(req))
			all := buf.Bytes()
			cut := len(all) - 13 // stream 3's DATA frame, its last 13 bytes held back
			if _, err := c.nc.Write(all[:cut]); err != nil {
				t.Fatal(err)
			}
			if got := c.outcome(1, 10*time.Second); !strings.HasSuffix(got, "grpc-status=0") {
				t.Fatalf("stream 1, complete, with the next frame half-sent: %q, want its answer", got)
			}
			if got := c.outcome(3, 10*time.Second); !endedAtDeadline(got, direct) {
				t.Fatalf("stream 3, its DATA half-sent past its 200 ms deadline: %q, want %q", got, deadlineExceeded)
			}
			c.nc.Write(all[cut:])
		})
	}
}

// TestRelayedStreamNeverRunsOutOfWindow: a relayed bidi stream whose
// messages are given back to the client's window only in large batches stalls
// once the next message is larger than what is left of the window: the
// client cannot send all of it, and the server waits for all of it. Here 40
// reflection requests of 6.5 KB (260 KB, under a 256 KiB batch) are followed
// by one of 800 KB, under the 1 MiB limit.
func TestRelayedStreamNeverRunsOutOfWindow(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			d := start(t, direct, server.Options{})
			cc, err := grpc.NewClient(d.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer cc.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			s, err := rpb.NewServerReflectionClient(cc).ServerReflectionInfo(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ask := func(host int) error {
				if err := s.Send(&rpb.ServerReflectionRequest{Host: strings.Repeat("h", host),
					MessageRequest: &rpb.ServerReflectionRequest_ListServices{ListServices: "*"}}); err != nil {
					return err
				}
				_, err := s.Recv()
				return err
			}
			for i := range 40 {
				if err := ask(6500); err != nil {
					t.Fatalf("request %d: %v", i, err)
				}
			}
			if err := ask(800_000); err != nil {
				t.Fatalf("the 800 KB request after 260 KB: %v", err)
			}
		})
	}
}
