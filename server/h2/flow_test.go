package h2_test

import (
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/server"
)

// largeRequest is a valid request of about size bytes: descriptors of up
// to eight entries, each value at most MaxValueBytes.
func largeRequest(size int) []byte {
	req := &rlsv3.RateLimitRequest{Domain: "test"}
	for i := 0; size > 0; i++ {
		if i%8 == 0 {
			req.Descriptors = append(req.Descriptors, &commonv3.RateLimitDescriptor{})
		}
		n := min(size, 4000)
		d := req.Descriptors[len(req.Descriptors)-1]
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: "free", Value: fmt.Sprintf("%d%s", i, strings.Repeat("v", n))})
		size -= n + 10
	}
	b, _ := proto.Marshal(req)
	return grpcMsg(b)
}

// interleave opens streams calls on one connection and sends their
// requests a frame at a time, round robin across the streams, as nghttp2 and
// grpc-js do with many calls in flight. It keeps to the server's windows and
// reports how many calls ended with grpc-status 0, and whether the
// connection stalled: no window to send and nothing arriving for a while.
func interleave(t *testing.T, addr string, streams int, body []byte) (ok int, stalled bool) {
	t.Helper()
	c := dialRaw(t, addr)
	c.nc.SetDeadline(time.Time{})
	var (
		mu      sync.Mutex
		cond    = sync.NewCond(&mu)
		connWin = int64(65535)
		strWin  = map[uint32]int64{}
		initWin = int64(65535)
		ended   = map[uint32]bool{}
		readErr error
	)
	id := func(i int) uint32 { return uint32(2*i + 1) }
	for i := range streams {
		strWin[id(i)] = initWin
	}
	go func() {
		for {
			f, err := c.fr.ReadFrame()
			mu.Lock()
			if err != nil {
				readErr = err
				cond.Broadcast()
				mu.Unlock()
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if v, ok := f.Value(http2.SettingInitialWindowSize); ok && !f.IsAck() {
					for k := range strWin {
						strWin[k] += int64(v) - initWin
					}
					initWin = int64(v)
				}
			case *http2.WindowUpdateFrame:
				if f.StreamID == 0 {
					connWin += int64(f.Increment)
				} else {
					strWin[f.StreamID] += int64(f.Increment)
				}
			case *http2.MetaHeadersFrame:
				if f.StreamEnded() {
					ended[f.StreamID] = true
					if headerValue(f, "grpc-status") == "0" {
						ok++
					}
				}
			case *http2.RSTStreamFrame:
				ended[f.StreamID] = true
			}
			cond.Broadcast()
			mu.Unlock()
		}
	}()
	for i := range streams {
		c.headers(id(i), "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit", false)
	}
	// waitFor waits until pred holds, and gives up when nothing has changed
	// for 10 s: the connection is stalled.
	waitFor := func(pred func() bool) bool {
		stop := time.AfterFunc(10*time.Second, func() {
			mu.Lock()
			stalled = true
			cond.Broadcast()
			mu.Unlock()
		})
		defer stop.Stop()
		for !pred() && !stalled && readErr == nil {
			cond.Wait()
		}
		return pred()
	}
	sent := make([]int, streams)
	mu.Lock()
	for more := true; more; {
		more = false
		for i := range streams {
			if sent[i] == len(body) {
				continue
			}
			n := min(len(body)-sent[i], 16384)
			if !waitFor(func() bool { return connWin >= int64(n) && strWin[id(i)] >= int64(n) }) {
				t.Logf("stalled sending stream %d: connection window %d, stream window %d, %d calls ended", id(i), connWin, strWin[id(i)], len(ended))
				mu.Unlock()
				return ok, true
			}
			connWin -= int64(n)
			strWin[id(i)] -= int64(n)
			mu.Unlock()
			if err := c.fr.WriteData(id(i), sent[i]+n == len(body), body[sent[i]:sent[i]+n]); err != nil {
				t.Fatal(err)
			}
			mu.Lock()
			sent[i] += n
			more = more || sent[i] < len(body)
		}
	}
	if !waitFor(func() bool { return len(ended) == streams }) {
		t.Logf("%d of %d calls ended", len(ended), streams)
	}
	defer mu.Unlock()
	return ok, stalled
}

// TestInterleavedLargeRequestsNeverStall: many large valid requests whose
// DATA frames interleave on one connection must all be answered. A server
// that gives the connection window back only when a request is complete
// runs it to zero with every request part-sent: nothing completes, and
// every call on the connection times out (rate limiting fails open).
func TestInterleavedLargeRequestsNeverStall(t *testing.T) {
	cases := []struct {
		streams, size int
	}{
		{300, 20 << 10},
		{16, 258 << 10},
	}
	for _, k := range cases {
		for _, direct := range []bool{true, false} {
			t.Run(fmt.Sprintf("%dx%dKiB/direct=%v", k.streams, k.size>>10, direct), func(t *testing.T) {
				d := start(t, direct, server.Options{})
				body := largeRequest(k.size)
				ok, stalled := interleave(t, d.addr, k.streams, body)
				if stalled || ok != k.streams {
					t.Fatalf("%d of %d calls answered OK (stalled: %v)", ok, k.streams, stalled)
				}
			})
		}
	}
}
