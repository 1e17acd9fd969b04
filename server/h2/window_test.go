package h2_test

import (
	"bytes"
	"encoding/binary"
	"net"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/server"
	"github.com/sharelimit/sharelimit/server/h2"
)

// rawClient speaks HTTP/2 frame by frame.
type rawClient struct {
	t    *testing.T
	nc   net.Conn
	fr   *http2.Framer
	hbuf bytes.Buffer
	henc *hpack.Encoder
}

func dialRaw(t *testing.T, addr string, settings ...http2.Setting) *rawClient {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	nc.SetDeadline(time.Now().Add(10 * time.Second))
	c := &rawClient{t: t, nc: nc, fr: http2.NewFramer(nc, nc)}
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.henc = hpack.NewEncoder(&c.hbuf)
	if _, err := nc.Write([]byte(http2.ClientPreface)); err != nil {
		t.Fatal(err)
	}
	if err := c.fr.WriteSettings(settings...); err != nil {
		t.Fatal(err)
	}
	return c
}

// call opens stream id with a ShouldRateLimit request, and extra header
// fields (name, value, ...).
func (c *rawClient) call(id uint32, req *rlsv3.RateLimitRequest, extra ...string) {
	c.t.Helper()
	c.hbuf.Reset()
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", h2.Path}, {":authority", "x"}, {"content-type", "application/grpc"}, {"te", "trailers"}} {
		c.henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for i := 0; i+1 < len(extra); i += 2 {
		c.henc.WriteField(hpack.HeaderField{Name: extra[i], Value: extra[i+1]})
	}
	if err := c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true}); err != nil {
		c.t.Fatal(err)
	}
	b, _ := proto.Marshal(req)
	if err := c.fr.WriteData(id, true, append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...)); err != nil {
		c.t.Fatal(err)
	}
}

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

func headerValue(f *http2.MetaHeadersFrame, name string) string {
	for _, hf := range f.Fields {
		if hf.Name == name {
			return hf.Value
		}
	}
	return ""
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
