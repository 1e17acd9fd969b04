package interop

import (
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// TestKeepalive: gRPC C-core's client keepalive against the daemon's ping
// policy (grpc-go's, as the daemon sets it: a PING less than 10 s after the
// last one is a strike; the third strike ends the connection).
//
// Aggressive: a PING every 2 s, with or without calls. The daemon must end
// the connection with GOAWAY ENHANCE_YOUR_CALM and the debug data
// "too_many_pings", the one signal on which gRPC clients back off: C-core
// then doubles its keepalive time for the next connection (2 s, 4 s, 8 s,
// 16 s, which the policy allows), so over 36 s with a channel that always
// reconnects it opens three connections (at about 0, 6 and 22 s). Without
// the signal it keeps its 2 s and is cut every 6 to 8 s, five or more times.
//
// Normal: a PING every 5 minutes stays connected, and the connection serves
// calls after a quiet spell.
func TestKeepalive(t *testing.T) {
	t.Parallel() // mostly idle: the other tests run meanwhile
	open := rq(ds("open", "keepalive"))
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) {
			t.Parallel()
			t.Run("aggressive", func(t *testing.T) {
				t.Parallel()
				need(t, cCore)
				d := startDaemon(t, tr)
				tp := newTap(t, d.grpcAddr)
				p := plan{Target: tp.addr(), Watch: true,
					Options: [][2]any{
						{"grpc.keepalive_time_ms", 2000},
						{"grpc.keepalive_permit_without_calls", 1},
						{"grpc.http2.max_pings_without_data", 0},
					},
					Steps: []step{calls(false, one(open)), sleep(36 * time.Second), calls(false, one(open))},
				}
				r := runPlan(t, cCore, p, 90*time.Second)
				t.Logf("C-core's channel states: %v", r.states)
				for i := range 2 {
					expect(t, cCore, r.results(t, 2*i), []want{answered(codeOK, unlimited)})
				}
				gs := tp.goaways(false)
				if len(gs) == 0 {
					t.Fatalf("no GOAWAY from the daemon in 36 s of PINGs every 2 s")
				}
				for _, g := range gs {
					if g.code != http2.ErrCodeEnhanceYourCalm || g.debug != "too_many_pings" {
						t.Errorf("the daemon's GOAWAY: %v with debug data %q, want ENHANCE_YOUR_CALM with \"too_many_pings\"", g.code, g.debug)
					}
				}
				const backoff = `ENHANCE_YOUR_CALM and debug data equal to "too_many_pings"`
				if !strings.Contains(r.stderr, backoff) {
					t.Errorf("C-core did not log %q, so it did not throttle its keepalive; its log:\n%s", backoff, clip(r.stderr, 3000))
				}
				if n := tp.connections(); n > 3 {
					t.Errorf("C-core opened %d connections in 36 s, want at most 3: it is not backing off", n)
				}
			})
			t.Run("normal", func(t *testing.T) {
				t.Parallel()
				need(t, cCore)
				d := startDaemon(t, tr)
				tp := newTap(t, d.grpcAddr)
				p := plan{Target: tp.addr(),
					Options: [][2]any{
						{"grpc.keepalive_time_ms", 300000},
						{"grpc.keepalive_permit_without_calls", 1},
					},
					Steps: []step{calls(false, one(open)), sleep(10 * time.Second), calls(false, one(open))},
				}
				r := runPlan(t, cCore, p, time.Minute)
				for i := range 2 {
					expect(t, cCore, r.results(t, 2*i), []want{answered(codeOK, unlimited)})
				}
				if gs := tp.goaways(false); len(gs) > 0 {
					t.Errorf("the daemon sent GOAWAY %+v to a client pinging every 5 minutes", gs)
				}
				if n := tp.connections(); n != 1 {
					t.Errorf("%d connections, want 1", n)
				}
			})
		})
	}
}
