package h2_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/server"
	"github.com/sharelimit/sharelimit/server/h2"
)

// headersSplit opens stream id with a header block sent as a HEADERS frame
// and as many CONTINUATION frames as the block needs.
func (c *rawClient) headersSplit(id uint32, block []byte, end bool) {
	c.t.Helper()
	const frame = 16384
	first := block[:min(len(block), frame)]
	block = block[len(first):]
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndHeaders: len(block) == 0, EndStream: end}); err != nil {
		c.t.Fatal(err)
	}
	for len(block) > 0 {
		n := min(len(block), frame)
		if err := c.fr.WriteContinuation(id, n == len(block), block[:n]); err != nil {
			c.t.Fatal(err)
		}
		block = block[n:]
	}
}

// TestHeaderListOverTheLimitEndsOnlyItsCall: a call whose header list is
// larger than the 64 KiB the server allows is refused alone. The other calls
// on the connection go on, and the HPACK state stays in step (the call after
// it reuses indexed fields). Ending the whole connection instead fails every
// call on it. Near the limit, a call is answered.
func TestHeaderListOverTheLimitEndsOnlyItsCall(t *testing.T) {
	req, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("free=x")}})
	many := func(total int) []string {
		var f []string
		for i := 0; total > 0; i++ {
			f = append(f, fmt.Sprintf("x-meta-%d", i), strings.Repeat("m", 1000))
			total -= 1000 + 40
		}
		return f
	}
	cases := []struct {
		name  string
		extra []string
		// refused: the direct transport refuses the call itself
		// (grpc-go's framer allows 16 MiB and answers it).
		refused bool
	}{
		{"60 KiB in many fields", many(60 << 10), false},
		{"70 KiB in many fields", many(70 << 10), true},
		{"one 70 KiB value", []string{"x-big", strings.Repeat("b", 70<<10)}, true},
		{"one 300 KiB value", []string{"x-big", strings.Repeat("b", 300<<10)}, true},
	}
	for _, k := range cases {
		for _, direct := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/direct=%v", k.name, direct), func(t *testing.T) {
				d := start(t, direct, server.Options{})
				c := dialRaw(t, d.addr)
				c.headersSplit(1, c.block(h2.Path, k.extra...), false)
				c.fr.WriteData(1, true, grpcMsg(req))
				c.call(3, &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("free=y")}})
				got := map[uint32]string{}
				c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
				for len(got) < 2 {
					f, err := c.fr.ReadFrame()
					if err != nil {
						t.Fatalf("after %v: %v", got, err)
					}
					switch f := f.(type) {
					case *http2.MetaHeadersFrame:
						if f.StreamEnded() {
							got[f.StreamID] = "grpc-status=" + headerValue(f, "grpc-status")
						}
					case *http2.RSTStreamFrame:
						if _, ok := got[f.StreamID]; !ok {
							got[f.StreamID] = "RST " + f.ErrCode.String()
						}
					case *http2.GoAwayFrame:
						t.Fatalf("GOAWAY %v %q after %v: every call on the connection fails", f.ErrCode, f.DebugData(), got)
					}
				}
				if got[3] != "grpc-status=0" {
					t.Errorf("the next call: %s, want grpc-status=0", got[3])
				}
				want := "grpc-status=0"
				if k.refused && direct {
					want = "grpc-status=8" // RESOURCE_EXHAUSTED
				}
				if got[1] != want {
					t.Errorf("the call itself: %s, want %s", got[1], want)
				}
			})
		}
	}
}
