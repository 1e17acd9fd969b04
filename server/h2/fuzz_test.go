package h2

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// stubRLS answers every request OK with one status per descriptor; the
// domain "wait" is answered after 1 ms, and an empty domain is refused.
type stubRLS struct{}

func (stubRLS) Answer(req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, time.Duration, error) {
	if req.Domain == "" {
		return nil, 0, status.Error(codes.InvalidArgument, "domain: empty")
	}
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}
	for range req.Descriptors {
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 7})
	}
	var wait time.Duration
	if req.Domain == "wait" {
		wait = time.Millisecond
	}
	return resp, wait, nil
}

// panicLog counts the transport's recovered panics.
type panicLog struct{ n *atomic.Int64 }

func (h panicLog) Enabled(context.Context, slog.Level) bool { return true }
func (h panicLog) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, "panic") {
		h.n.Add(1)
	}
	return nil
}
func (h panicLog) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h panicLog) WithGroup(string) slog.Handler      { return h }

// clientFrames writes what a client sends: the frames fn writes, after
// the preface and an empty SETTINGS.
func clientFrames(fn func(fr *http2.Framer, enc func(fields ...string) []byte)) []byte {
	var buf bytes.Buffer
	fr := http2.NewFramer(&buf, nil)
	var hbuf bytes.Buffer
	henc := hpack.NewEncoder(&hbuf)
	enc := func(fields ...string) []byte {
		hbuf.Reset()
		for i := 0; i+1 < len(fields); i += 2 {
			henc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
		}
		return append([]byte(nil), hbuf.Bytes()...)
	}
	fr.WriteSettings()
	fn(fr, enc)
	return buf.Bytes()
}

// grpcMessage frames a request as a gRPC message.
func grpcMessage(req *rlsv3.RateLimitRequest) []byte {
	b, _ := proto.Marshal(req)
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...)
}

func fuzzSeeds() [][]byte {
	rlsHeaders := []string{":method", "POST", ":scheme", "http", ":path", Path, ":authority", "x", "content-type", "application/grpc", "te", "trailers"}
	req := grpcMessage(&rlsv3.RateLimitRequest{Domain: "d"})
	return [][]byte{
		clientFrames(func(fr *http2.Framer, enc func(...string) []byte) {
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: enc(rlsHeaders...), EndHeaders: true})
			fr.WriteData(1, true, req)
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: enc(append(rlsHeaders, "grpc-timeout", "1m")...), EndHeaders: true})
			fr.WriteData(3, false, req[:3])
			fr.WriteData(3, true, req[3:])
			fr.WritePing(false, [8]byte{1})
		}),
		clientFrames(func(fr *http2.Framer, enc func(...string) []byte) {
			fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1}, http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0})
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: enc(rlsHeaders...), EndHeaders: true})
			fr.WriteData(1, true, grpcMessage(&rlsv3.RateLimitRequest{Domain: "wait"}))
			fr.WriteWindowUpdate(1, 3)
			fr.WriteWindowUpdate(0, 100)
			fr.WriteRSTStream(1, http2.ErrCodeCancel)
		}),
		clientFrames(func(fr *http2.Framer, enc func(...string) []byte) {
			hc := []string{":method", "POST", ":scheme", "http", ":path", "/grpc.health.v1.Health/Watch", "content-type", "application/grpc"}
			b, _ := proto.Marshal(&healthpb.HealthCheckRequest{})
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: enc(hc...), EndHeaders: true})
			fr.WriteData(1, true, append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...))
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: enc(":method", "GET", ":scheme", "http", ":path", "/"), EndHeaders: true, EndStream: true})
			fr.WriteGoAway(0, http2.ErrCodeNo, nil)
		}),
		clientFrames(func(fr *http2.Framer, enc func(...string) []byte) {
			block := enc(rlsHeaders...)
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:4]})
			fr.WriteContinuation(1, true, block[4:])
			fr.WriteData(1, false, []byte{1, 0, 0, 0, 1})
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: enc("x", "y"), EndHeaders: true, EndStream: true})
		}),
	}
}

// FuzzConn sends a connection's bytes, after the client preface: whatever
// they are, the connection ends once the client hangs up, with no panic and
// nothing left running.
func FuzzConn(f *testing.F) {
	for _, s := range fuzzSeeds() {
		f.Add(s)
	}
	var panics atomic.Int64
	inner := grpc.NewServer()
	healthpb.RegisterHealthServer(inner, health.NewServer())
	s := New(stubRLS{}, inner, nil, slog.New(panicLog{&panics}))
	// Connections are handed over without Serve, which would start the
	// grpc-go server the relayed calls go to.
	s.mu.Lock()
	err := s.startInner()
	s.mu.Unlock()
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(s.Stop)
	f.Fuzz(func(t *testing.T, b []byte) {
		client, srv := net.Pipe()
		if !s.track(srv) {
			t.Fatal("server stopped")
		}
		read := make(chan struct{})
		go func() {
			defer close(read)
			io.Copy(io.Discard, client)
		}()
		client.SetWriteDeadline(time.Now().Add(2 * time.Second))
		client.Write([]byte(http2.ClientPreface))
		client.Write(b)
		client.Close()
		<-read
		s.mu.Lock()
		for len(s.conns) > 0 {
			s.connsGone.Wait()
		}
		s.mu.Unlock()
		if n := panics.Load(); n > 0 {
			t.Fatalf("%d panics recovered", n)
		}
	})
}
