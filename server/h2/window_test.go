package h2_test

import (
	"encoding/binary"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/server"
)

// TestAnswerWaitsForTheWindow: a client that allows one byte per stream gets
// one byte, and the rest of the answer, then its trailers, as it opens the
// window; nothing is sent past it.
func TestAnswerWaitsForTheWindow(t *testing.T) {
	d := start(t, true, server.Options{})
	c := dialRaw(t, d.addr, http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1})
	c.call(1, &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("fixed=one"), desc("ip=x")}})
	var body []byte
	window, opened, trailers := int64(1), false, false
	for !trailers {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatalf("after %d bytes: %v", len(body), err)
		}
		switch f := f.(type) {
		case *http2.DataFrame:
			if window -= int64(len(f.Data())); window < 0 {
				t.Fatalf("sent %d bytes past the window", -window)
			}
			body = append(body, f.Data()...)
			if !opened {
				// One byte came; open the window for the rest.
				opened = true
				window += 1 << 16
				c.fr.WriteWindowUpdate(1, 1<<16)
			}
		case *http2.MetaHeadersFrame:
			trailers = f.StreamEnded()
			if trailers && f.PseudoValue("status") == "" && headerValue(f, "grpc-status") != "0" {
				t.Fatalf("trailers %v", f.Fields)
			}
		case *http2.SettingsFrame:
			if !f.IsAck() {
				c.fr.WriteSettingsAck()
			}
		}
	}
	if len(body) < 5 || int(binary.BigEndian.Uint32(body[1:5])) != len(body)-5 {
		t.Fatalf("answer of %d bytes: %x", len(body), body)
	}
	var resp rlsv3.RateLimitResponse
	if err := proto.Unmarshal(body[5:], &resp); err != nil || len(resp.Statuses) != 2 || resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("answer %v %v", &resp, err)
	}
}

// TestServerEndsACallAtItsDeadline: a call held back by a wait policy past
// its grpc-timeout is ended by the server with DEADLINE_EXCEEDED at the
// deadline, not answered when the wait is over.
func TestServerEndsACallAtItsDeadline(t *testing.T) {
	d := start(t, true, server.Options{})
	c := dialRaw(t, d.addr)
	slow := &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("slow=a")}}
	c.call(1, slow) // empties the bucket of 1
	c.call(3, slow, "grpc-timeout", "10m")
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatal(err)
		}
		if f, ok := f.(*http2.MetaHeadersFrame); ok && f.StreamID == 3 && f.StreamEnded() {
			if got := headerValue(f, "grpc-status"); got != "4" {
				t.Fatalf("stream 3 ended with grpc-status %q (%v), want 4 (DEADLINE_EXCEEDED)", got, f.Fields)
			}
			return
		}
		if f, ok := f.(*http2.DataFrame); ok && f.StreamID == 3 {
			t.Fatal("stream 3 answered past its deadline")
		}
	}
}
