package h2_test

import (
	"encoding/binary"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
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

// TestPingFlood: PINGs back to back on a quiet connection end it with
// ENHANCE_YOUR_CALM, as grpc-go's enforcement does; PINGs between answers on
// a long-lived stream do not.
func TestPingFlood(t *testing.T) {
	d := start(t, true, server.Options{})
	c := dialRaw(t, d.addr)
	b, _ := proto.Marshal(&healthpb.HealthCheckRequest{Service: "ratelimit"})
	c.headers(1, "/grpc.health.v1.Health/Watch", false)
	c.fr.WriteData(1, true, grpcMsg(b))
	data := func() {
		t.Helper()
		for {
			f, err := c.fr.ReadFrame()
			if err != nil {
				t.Fatal(err)
			}
			switch f := f.(type) {
			case *http2.DataFrame:
				return
			case *http2.GoAwayFrame:
				t.Fatalf("GOAWAY %v while the stream was answering", f.ErrCode)
			}
		}
	}
	data() // SERVING
	for i := range 6 {
		c.fr.WritePing(false, [8]byte{byte(i)})
		st := healthpb.HealthCheckResponse_NOT_SERVING
		if i%2 == 1 {
			st = healthpb.HealthCheckResponse_SERVING
		}
		d.health.SetServingStatus("ratelimit", st)
		data()
	}
	for i := range 4 {
		c.fr.WritePing(false, [8]byte{9, byte(i)})
	}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			t.Fatalf("no GOAWAY: %v", err)
		}
		if g, ok := f.(*http2.GoAwayFrame); ok {
			// gRPC clients back their keepalive off only on this exact
			// debug data; on any other they reconnect and are cut again.
			if g.ErrCode != http2.ErrCodeEnhanceYourCalm || string(g.DebugData()) != "too_many_pings" {
				t.Fatalf("GOAWAY %v %q, want ENHANCE_YOUR_CALM \"too_many_pings\"", g.ErrCode, g.DebugData())
			}
			return
		}
	}
}
