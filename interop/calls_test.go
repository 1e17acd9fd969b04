package interop

import (
	"io"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

// TestCancellations: C-core and grpc-js cancel calls the daemon holds (a
// wait policy with no token for a minute) and large calls while their bodies
// are still on the way; each cancel is a RST_STREAM. The connection must
// keep serving: the next call on it gets its answer.
func TestCancellations(t *testing.T) {
	r258k, w258k := largeRequest(64)
	forEachTransport(t, func(t *testing.T, d *daemon) {
		for _, client := range grpcClients {
			t.Run(client, func(t *testing.T) {
				tp := newTap(t, d.grpcAddr)
				stuck := rq(ds("stuck", client))
				p := plan{Target: tp.addr(), Steps: []step{
					// the one token
					calls(false, one(stuck)),
					// 7 calls held for a minute or more, cancelled at
					// 200 ms; 20 of 258 KB cancelled 5 ms after they start
					calls(true,
						call{Req: stuck, CancelAfterMs: ms(200), Repeat: 7},
						call{Req: r258k, CancelAfterMs: ms(5), Repeat: 20}),
					// the same connection still answers
					calls(false, one(rq(ds("user", client)))),
				}}
				r := runPlan(t, client, p, stall)
				expect(t, client+" (the token)", r.results(t, 0), []want{answered(codeOK, okRemaining(0, perMinute(1)))})
				got := r.results(t, 1)
				for i, res := range got[:7] {
					if codes.Code(res.Code) != codes.Canceled {
						t.Errorf("held call %d: got %s, want Canceled (the daemon holds it for a minute or more)", i, res)
					}
				}
				for i, res := range got[7:] {
					if codes.Code(res.Code) != codes.Canceled && w258k.mismatch(res) != "" {
						t.Errorf("large call %d: got %s, want Canceled or its answer", i, clip(res.String(), 300))
					}
				}
				expect(t, client+" (after the cancels)", r.results(t, 2), []want{answered(codeOK, okRemaining(9, perDay(10)))})
				if n := tp.frames(true, http2.FrameRSTStream); n < 7 {
					t.Errorf("the client sent %d RST_STREAM frames, want at least 7: the cancels were not tested", n)
				}
				if n := tp.connections(); n != 1 {
					t.Errorf("%d connections, want 1: the cancels cost the connection", n)
				}
				if g := tp.goaways(false); len(g) > 0 {
					t.Errorf("the daemon sent GOAWAY %+v", g)
				}
			})
		}
	})
}

// TestDeadlines: a call with a short deadline that the daemon holds past
// it; a call that arrives with its deadline already gone (grpc-timeout 0n),
// which must be refused with DEADLINE_EXCEEDED and spend no token; and a
// call whose body never arrives, which the daemon must end at its deadline.
func TestDeadlines(t *testing.T) {
	forEachTransport(t, func(t *testing.T, d *daemon) {
		for _, client := range grpcClients {
			t.Run(client, func(t *testing.T) {
				stuck := rq(ds("stuck", "deadline-"+client))
				p := plan{Target: d.grpcAddr, Steps: []step{
					calls(false, one(stuck), call{Req: stuck, TimeoutMs: 300}, one(rq(ds("open", "after")))),
				}}
				got := runPlan(t, client, p, stall).results(t, 0)
				// grpc-go's server resets the stream (RST_STREAM CANCEL)
				// when the deadline passes; a client whose own deadline
				// timer has not fired yet, which a busy machine delays,
				// reports that reset as CANCELLED ("Call cancelled" in
				// grpc-js). Either way the call ended at its deadline.
				if d.transport == "grpc-go" && len(got) == 3 && codes.Code(got[1].Code) == codes.Canceled {
					got[1].Code = int(codes.DeadlineExceeded)
				}
				expect(t, client, got, []want{
					answered(codeOK, okRemaining(0, perMinute(1))),
					failed(codes.DeadlineExceeded, ""),
					answered(codeOK, unlimited),
				})
			})
		}
		t.Run("curl expired", func(t *testing.T) {
			tp := newTap(t, d.grpcAddr)
			r := rq(ds("user", "expired"))
			got := curlTapped(t, tp, r, "-H", "grpc-timeout: 0n")
			if m := failed(codes.DeadlineExceeded, "").mismatch(got); m != "" {
				t.Errorf("a call with grpc-timeout 0n: %s", m)
			}
			// A check (hits_addend 0) shows whether the expired call spent
			// a token.
			got = curlTapped(t, tp, rq(ds("user", "expired").hits(0)))
			if m := answered(codeOK, okRemaining(10, perDay(10))).mismatch(got); m != "" {
				t.Errorf("after the expired call: %s (10 remaining: the expired call spent nothing)", m)
			}
		})
		t.Run("curl body never sent", func(t *testing.T) {
			need(t, curl)
			// curl -T - sends the headers (grpc-timeout 500m) and then
			// waits for its standard input, which stays open until the tap
			// has seen the daemon end the stream (or 10 s).
			tp := newTap(t, d.grpcAddr)
			pr, pw := io.Pipe()
			done := make(chan error, 1)
			go func() {
				args := append([]string{"-sS", "-o", "/dev/null", "--http2-prior-knowledge", "-X", "POST", "-T", "-",
					"-H", "Expect:", "-H", "grpc-timeout: 500m"}, grpcHeaders...)
				_, _, err := runTool(t, stall, pr, "curl", append(args, tp.url())...)
				done <- err
			}()
			ended := tp.waitFor(10*time.Second, func() bool {
				for _, c := range tp.conns {
					if s := c.streams[1]; s != nil && !s.serverEnd.IsZero() {
						return true
					}
				}
				return false
			})
			pw.Close()
			<-done // curl's own view of a stream ended under it varies; the tap's is read below
			if !ended {
				t.Fatalf("the daemon did not end a call 10 s after its 500 ms deadline while its body had not arrived")
			}
			cs := tp.calls()
			if len(cs) != 1 {
				t.Fatalf("%d calls on the wire, want 1", len(cs))
			}
			// Ended means DEADLINE_EXCEEDED in trailers, or a reset:
			// grpc-go does either, as its deadline timer or its handler
			// gets there first, and a client sees its own deadline
			// either way.
			switch c := cs[0]; {
			case c.rst != nil && c.err != nil:
				if *c.rst != http2.ErrCodeCancel {
					t.Errorf("a call whose body never came: reset with %v, want DEADLINE_EXCEEDED or a reset with CANCEL", *c.rst)
				}
			case c.err != nil:
				t.Fatalf("the daemon's answer: %v", c.err)
			default:
				if m := failed(codes.DeadlineExceeded, "").mismatch(c.result); m != "" {
					t.Errorf("a call whose body never came: %s", m)
				}
			}
		})
	})
}
