package h2_test

import (
	"bytes"
	"runtime"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sharelimit/sharelimit/server"
)

// TestRapidResetOfRelayedCalls: a client opens relayed calls and
// resets each at once (HTTP/2 "rapid reset"). The stream leaves c.streams on
// RST, so MaxConcurrentStreams no longer bounds it, but its two relay
// goroutines (and inner grpc-go stream) live on. grpc-go alone keeps a reset
// stream counted until its handler returns, which bounds the work to about
// MaxConcurrentStreams per connection.
func TestRapidResetOfRelayedCalls(t *testing.T) {
	for _, direct := range []bool{false, true} {
		d := start(t, direct, server.Options{})
		c := dialRaw(t, d.addr)
		base := runtime.NumGoroutine()
		done := make(chan struct{})
		go func() {
			defer close(done)
			for {
				if _, err := c.fr.ReadFrame(); err != nil {
					return
				}
			}
		}()
		var buf, hb bytes.Buffer
		fr := http2.NewFramer(&buf, nil)
		enc := hpack.NewEncoder(&hb)
		for i, id := 0, uint32(1); i < 100000; i, id = i+1, id+2 {
			hb.Reset()
			for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", "/grpc.health.v1.Health/Watch"}, {":authority", "x"}, {"content-type", "application/grpc"}} {
				enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
			}
			fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: hb.Bytes(), EndHeaders: true})
			fr.WriteData(id, true, []byte{0, 0, 0, 0, 0})
			fr.WriteRSTStream(id, http2.ErrCodeCancel)
		}
		stop, peakc := make(chan struct{}), make(chan int)
		go func() {
			peak := 0
			for {
				select {
				case <-stop:
					peakc <- peak
					return
				default:
				}
				peak = max(peak, runtime.NumGoroutine())
				time.Sleep(time.Millisecond)
			}
		}()
		c.nc.Write(buf.Bytes())
		time.Sleep(time.Second)
		close(stop)
		peak := <-peakc
		c.nc.Close()
		<-done
		t.Logf("direct=%v: goroutines base %d, peak %d", direct, base, peak)
		if peak-base > 2*1024+500 {
			t.Errorf("direct=%v: one connection's reset calls peaked at %d goroutines over the %d before (MaxConcurrentStreams is 1024)", direct, peak-base, base)
		}
	}
}
