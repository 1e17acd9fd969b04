package h2_test

import (
	"fmt"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/server"
	"github.com/sharelimit/sharelimit/server/h2"
)

// deadlineExceeded is how grpc-go's server ends a call at its deadline.
const deadlineExceeded = ":status=200 grpc-status=4 grpc-message=context deadline exceeded"

// endedAtDeadline reports whether a call's outcome is its end at its
// deadline. grpc-go's server races its deadline's RST_STREAM CANCEL against
// the handler's DEADLINE_EXCEEDED, and sends either; the direct transport
// sends the status.
func endedAtDeadline(got string, direct bool) bool {
	return got == deadlineExceeded || (!direct && got == "RST CANCEL")
}

// TestCallWithoutItsBodyEndsAtItsDeadline: a call whose request never
// arrives is ended by the server with DEADLINE_EXCEEDED at its grpc-timeout,
// not held open until the client gives up.
func TestCallWithoutItsBodyEndsAtItsDeadline(t *testing.T) {
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			d := start(t, direct, server.Options{})
			c := dialRaw(t, d.addr)
			c.headers(1, h2.Path, false, "grpc-timeout", "200m")
			// Half of a request, and never the rest.
			b, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("fixed=one")}})
			c.fr.WriteData(1, false, grpcMsg(b)[:4])
			if got := c.outcome(1, 10*time.Second); !endedAtDeadline(got, direct) {
				t.Fatalf("the call ended %q, want %q", got, deadlineExceeded)
			}
		})
	}
}

// TestExpiredCallIsNeverDecided: a call whose deadline has passed when its
// request is complete gets DEADLINE_EXCEEDED and spends no token: the client
// has given up on it, so a token spent on it is a request refused later for
// nothing, and an OK it never reads.
func TestExpiredCallIsNeverDecided(t *testing.T) {
	fixed, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("fixed=one")}})
	for _, direct := range []bool{true, false} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) {
			d := start(t, direct, server.Options{})
			c := dialRaw(t, d.addr)
			c.headers(1, h2.Path, false, "grpc-timeout", "0n")
			c.fr.WriteData(1, true, grpcMsg(fixed))
			if got := c.outcome(1, 5*time.Second); !endedAtDeadline(got, direct) {
				t.Errorf("the expired call ended %q, want %q", got, deadlineExceeded)
			}
			// A deadline that passes while the request arrives.
			c.headers(3, h2.Path, false, "grpc-timeout", "50m")
			c.fr.WriteData(3, false, grpcMsg(fixed)[:3])
			time.Sleep(100 * time.Millisecond)
			c.fr.WriteData(3, true, grpcMsg(fixed)[3:])
			if got := c.outcome(3, 5*time.Second); !endedAtDeadline(got, direct) {
				t.Errorf("the call that expired on its way ended %q, want %q", got, deadlineExceeded)
			}
			// fixed=one allows 2 and the clock stands still: both are
			// OK only if the expired calls spent nothing.
			for i, id := range []uint32{5, 7} {
				c.headers(id, h2.Path, false)
				c.fr.WriteData(id, true, grpcMsg(fixed))
				if code := answerCode(t, c, id); code != rlsv3.RateLimitResponse_OK {
					t.Errorf("call %d after the expired ones: %v, want OK", i+1, code)
				}
			}
		})
	}
}

// answerCode reads stream id's answer and returns its overall_code.
func answerCode(t *testing.T, c *rawClient, id uint32) rlsv3.RateLimitResponse_Code {
	t.Helper()
	c.nc.SetReadDeadline(time.Now().Add(5 * time.Second))
	defer c.nc.SetReadDeadline(time.Time{})
	var body []byte
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if f.Header().StreamID != id {
			continue
		}
		switch f := f.(type) {
		case *http2.DataFrame:
			body = append(body, f.Data()...)
		case *http2.MetaHeadersFrame:
			if !f.StreamEnded() {
				continue
			}
			if s := headerValue(f, "grpc-status"); s != "0" || len(body) < 5 {
				t.Fatalf("stream %d: grpc-status %s, %d bytes", id, s, len(body))
			}
			var resp rlsv3.RateLimitResponse
			if err := proto.Unmarshal(body[5:], &resp); err != nil {
				t.Fatal(err)
			}
			return resp.OverallCode
		case *http2.RSTStreamFrame:
			t.Fatalf("stream %d reset: %v", id, f.ErrCode)
		}
	}
}
