package interop

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// stall is how long a client may take before it counts as stalled. The
// healthy runs take about a second; the time only tells a stall apart.
const stall = 30 * time.Second

// largeRequest is a valid request of n descriptors, each an unlimited key
// with a value of 4030 bytes (the cap is 4096), all answered OK: 5 make a
// body of 20 KB, 64 (the most a request may have) one of 258 KB.
func largeRequest(n int) (request, want) {
	var descs []desc
	var sts []status
	for i := range n {
		v := fmt.Sprintf("%04d", i) + strings.Repeat("v", 4026)
		descs = append(descs, ds("open", v))
		sts = append(sts, unlimited)
	}
	return rq(descs...), answered(codeOK, sts...)
}

// TestInterleavedLargeRequests: many large requests in flight on one
// connection, whose DATA frames each client interleaves as it likes. Every
// one must be answered; a connection whose window is not given back as the
// DATA arrives stalls here.
func TestInterleavedLargeRequests(t *testing.T) {
	r20k, w20k := largeRequest(5)
	r258k, w258k := largeRequest(64)
	forEachTransport(t, func(t *testing.T, d *daemon) {
		for _, c := range []struct {
			name     string
			r        request
			w        want
			n, inAir int
		}{
			{"h2load 200 of 20 KB", r20k, w20k, 400, 200},
			{"h2load 16 of 258 KB", r258k, w258k, 32, 16},
		} {
			t.Run(c.name, func(t *testing.T) {
				tp := newTap(t, d.grpcAddr)
				before := d.decided()
				body := c.r.body()
				t.Logf("request body: %d bytes", len(body))
				run := runH2load(t, stall, body, "-n", fmt.Sprint(c.n), "-c", "1", "-m", fmt.Sprint(c.inAir), tp.url())
				run.allSucceeded(t, c.n)
				checkTapCalls(t, tp, c.n, c.w)
				if n := tp.connections(); n != 1 {
					t.Errorf("%d connections, want 1", n)
				}
				if got := d.decided() - before; got != c.n {
					t.Errorf("the daemon decided %d requests, want %d", got, c.n)
				}
			})
		}
		for _, client := range grpcClients {
			t.Run(client+" 300 of 20 KB", func(t *testing.T) {
				tp := newTap(t, d.grpcAddr)
				p := plan{Target: tp.addr(), Steps: []step{calls(true, call{Req: r20k, Repeat: 300})}}
				got := runPlan(t, client, p, stall).results(t, 0)
				wants := make([]want, 300)
				for i := range wants {
					wants[i] = w20k
				}
				expect(t, client, got, wants)
				if n := tp.connections(); n != 1 {
					t.Errorf("%d connections, want 1", n)
				}
			})
		}
	})
}

// TestManyStreams: 2,000 streams on one connection, 100 at a time.
func TestManyStreams(t *testing.T) {
	r, w := rq(ds("open", "many")), answered(codeOK, unlimited)
	forEachTransport(t, func(t *testing.T, d *daemon) {
		tp := newTap(t, d.grpcAddr)
		run := runH2load(t, stall, r.body(), "-n", "2000", "-c", "1", "-m", "100", tp.url())
		run.allSucceeded(t, 2000)
		checkTapCalls(t, tp, 2000, w)
		if n := tp.connections(); n != 1 {
			t.Errorf("%d connections, want 1", n)
		}
	})
}

// TestTinyWindows: clients that open windows of 1023 bytes
// (SETTINGS_INITIAL_WINDOW_SIZE, -w 10) and a connection window of the
// same bits (-W 10), for answers of about 14 KB: the daemon must send each
// answer in pieces as the client opens its window, and every answer must
// arrive whole.
func TestTinyWindows(t *testing.T) {
	var descs []desc
	for i := range 64 {
		descs = append(descs, ds("wide", fmt.Sprint(i)))
	}
	r := rq(descs...)
	check := func(res result) string {
		if res.Code != 0 || res.Resp == nil || res.Resp.Overall != codeOK || len(res.Resp.Statuses) != 64 {
			return fmt.Sprintf("got %s, want OK with 64 OK statuses", clip(res.String(), 300))
		}
		for i, s := range res.Resp.Statuses {
			if s.Code != codeOK || s.Limit == nil || s.Limit.Name != wideName || s.Limit.RequestsPerUnit != 1_000_000 {
				return fmt.Sprintf("status %d: %+v, want OK under the wide rule", i, s)
			}
		}
		return ""
	}
	forEachTransport(t, func(t *testing.T, d *daemon) {
		t.Run(h2load, func(t *testing.T) {
			tp := newTap(t, d.grpcAddr)
			run := runH2load(t, stall, r.body(), "-n", "100", "-c", "1", "-m", "10", "-w", "10", "-W", "10", tp.url())
			run.allSucceeded(t, 100)
			checkTapCallsBy(t, tp, 100, check)
			tinyWindowsKept(t, tp)
		})
		t.Run(nghttp, func(t *testing.T) {
			need(t, nghttp)
			tp := newTap(t, d.grpcAddr)
			args := append([]string{"-w", "10", "-W", "10", "-d", writeBody(t, r.body())}, grpcHeaders...)
			if out, stderr, err := runTool(t, stall, nil, "nghttp", append(args, tp.url())...); err != nil {
				t.Fatalf("nghttp: %v\n%s\n%s", err, clip(out, 2000), stderr)
			}
			checkTapCallsBy(t, tp, 1, check)
			tinyWindowsKept(t, tp)
		})
	})
}

// tinyWindowsKept checks that the answers needed the client's
// WINDOW_UPDATEs and that no DATA frame of the daemon's overran a 1023-byte
// window.
func tinyWindowsKept(t *testing.T, tp *tap) {
	t.Helper()
	if n := tp.frames(true, http2.FrameWindowUpdate); n == 0 {
		t.Errorf("the client sent no WINDOW_UPDATE: the answers fit its window, nothing was tested")
	}
	if n := tp.maxFrame(false, http2.FrameData); n > 1023 {
		t.Errorf("the daemon sent a DATA frame of %d bytes into a window of 1023", n)
	}
}
