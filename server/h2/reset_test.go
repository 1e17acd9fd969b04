package h2_test

import (
	"bytes"
	"fmt"
	"runtime"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/server"
)

// TestRapidResetOfRelayedCalls: a client opens relayed calls and
// resets each at once (HTTP/2 "rapid reset"). The stream leaves c.streams on
// RST, so MaxConcurrentStreams no longer bounds it, but its two relay
// goroutines (and inner grpc-go stream) live on. grpc-go alone keeps a reset
// stream counted until its handler returns, which bounds the work to about
// MaxConcurrentStreams per connection.
//
// The goroutines counted are the whole process's, so each transport runs in a
// subtest of its own, whose server is stopped at its end, and the count
// before is taken once the goroutines of anything before have ended.
func TestRapidResetOfRelayedCalls(t *testing.T) {
	before := runtime.NumGoroutine()
	for _, direct := range []bool{false, true} {
		t.Run(fmt.Sprintf("direct=%v", direct), func(t *testing.T) { rapidReset(t, direct, before) })
	}
}

func rapidReset(t *testing.T, direct bool, before int) {
	{
		settle(t, before)
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

// settle waits until the process is back to at most a few goroutines more
// than before: a server stopped earlier may still be ending the calls it
// had, and those would be counted against the next.
func settle(t *testing.T, before int) {
	t.Helper()
	testutil.Eventually(t, time.Minute, func() error {
		if n := runtime.NumGoroutine(); n > before+20 {
			return fmt.Errorf("%d goroutines after the last server stopped, %d before it started", n, before)
		}
		return nil
	})
}
