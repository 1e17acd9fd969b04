package h2_test

import (
	"fmt"
	"strings"
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

// sendBody sends body on stream id in frames the server's windows allow,
// reading what arrives meanwhile; it reports the stream's outcome, or a
// stall: no window to send and nothing arriving for 10 s.
func (c *rawClient) sendBody(id uint32, body []byte) string {
	c.t.Helper()
	connWin, strWin := int64(65535), int64(65535)
	var parts []string
	ended := false
	read := func() {
		c.nc.SetReadDeadline(time.Now().Add(10 * time.Second))
		defer c.nc.SetReadDeadline(time.Time{})
		f, err := c.fr.ReadFrame()
		if err != nil {
			parts = append(parts, "stalled: "+err.Error())
			ended = true
			return
		}
		switch f := f.(type) {
		case *http2.SettingsFrame:
			if v, ok := f.Value(http2.SettingInitialWindowSize); ok && !f.IsAck() {
				strWin += int64(v) - 65535
			}
		case *http2.WindowUpdateFrame:
			if f.StreamID == 0 {
				connWin += int64(f.Increment)
			} else if f.StreamID == id {
				strWin += int64(f.Increment)
			}
		case *http2.MetaHeadersFrame:
			if f.StreamID == id {
				for _, hf := range f.Fields {
					if hf.Name == ":status" || hf.Name == "grpc-status" {
						parts = append(parts, hf.Name+"="+hf.Value)
					}
				}
				ended = ended || f.StreamEnded()
			}
		case *http2.DataFrame:
			if f.StreamID == id {
				parts = append(parts, fmt.Sprintf("data(%d)", len(f.Data())))
				ended = ended || f.StreamEnded()
			}
		case *http2.RSTStreamFrame:
			if f.StreamID == id {
				parts = append(parts, "RST "+f.ErrCode.String())
				ended = true
			}
		}
	}
	for sent := 0; sent < len(body) && !ended; {
		n := min(int64(len(body)-sent), 16384, connWin, strWin)
		if n <= 0 {
			read()
			continue
		}
		if err := c.fr.WriteData(id, sent+int(n) == len(body), body[sent:sent+int(n)]); err != nil {
			break // the server may reset the stream and close its side
		}
		connWin -= n
		strWin -= n
		sent += int(n)
	}
	for !ended {
		read()
	}
	return strings.Join(parts, " ")
}

// TestRefusedRequestsNeverStall: a request the server refuses whatever its
// body (not gRPC, or a unary call sent two messages) must be refused however
// large the body, not wait for an end that the stream's window never lets
// the client reach.
func TestRefusedRequestsNeverStall(t *testing.T) {
	one, _ := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("free=" + strings.Repeat("v", 4000))}})
	var two []byte
	for len(two) < 1_200_000 {
		two = append(two, grpcMsg(one)...)
	}
	big := make([]byte, 2<<20)
	cases := []struct {
		name  string
		extra []string
		body  []byte
		want  string
	}{
		{"2 MiB of JSON", []string{"content-type", "application/json"}, big, ":status=415"},
		{"a unary call sent 1.2 MB of messages", nil, two, "grpc-status=13"},
	}
	for _, k := range cases {
		for _, direct := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/direct=%v", k.name, direct), func(t *testing.T) {
				d := start(t, direct, server.Options{})
				c := dialRaw(t, d.addr)
				c.hb.Reset()
				fields := []string{":method", "POST", ":scheme", "http", ":path", h2.Path, ":authority", "x", "te", "trailers"}
				if k.extra == nil {
					fields = append(fields, "content-type", "application/grpc")
				}
				fields = append(fields, k.extra...)
				for i := 0; i < len(fields); i += 2 {
					c.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
				}
				c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.hb.Bytes(), EndHeaders: true})
				got := c.sendBody(1, k.body)
				if !strings.Contains(got, k.want) || strings.Contains(got, "stalled") {
					t.Fatalf("got %q, want %s", got, k.want)
				}
			})
		}
	}
}

// TestHeadIsRefusedWithoutABody: a response to HEAD has no content (RFC
// 9110); a refusal that sends its text anyway is a protocol error to curl -I
// and nghttp.
func TestHeadIsRefusedWithoutABody(t *testing.T) {
	d := start(t, true, server.Options{})
	c := dialRaw(t, d.addr)
	c.hb.Reset()
	for _, f := range [][2]string{{":method", "HEAD"}, {":scheme", "http"}, {":path", h2.Path}, {":authority", "x"}} {
		c.enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: c.hb.Bytes(), EndHeaders: true, EndStream: true})
	if got := c.outcome(1, 5*time.Second); got != ":status=405" {
		t.Fatalf("HEAD: %q, want :status=405 alone", got)
	}
}

// TestSelfDependentTrailersFreeTheirStream: trailers whose priority names
// their own stream reset it (a stream error); the stream must be forgotten,
// or each such call holds a slot until the connection ends, and after
// MaxConcurrentStreams of them every new stream is refused.
func TestSelfDependentTrailersFreeTheirStream(t *testing.T) {
	d := start(t, true, server.Options{})
	c := dialRaw(t, d.addr)
	for i := range h2.MaxConcurrentStreams + 10 {
		id := uint32(2*i + 1)
		c.headers(id, h2.Path, false)
		c.hb.Reset()
		c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true,
			Priority: http2.PriorityParam{StreamDep: id}})
	}
	id := uint32(2*(h2.MaxConcurrentStreams+10) + 1)
	c.call(id, &rlsv3.RateLimitRequest{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{desc("free=x")}})
	if got := c.outcome(id, 10*time.Second); !strings.HasSuffix(got, "grpc-status=0") {
		t.Fatalf("a call after %d self-dependent trailers: %q, want it answered", h2.MaxConcurrentStreams+10, got)
	}
}
