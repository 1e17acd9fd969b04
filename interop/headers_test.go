package interop

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

// padding is request metadata of about size bytes of header list, as HTTP/2
// counts it (name, value and 32 for each field), in fields of up to each
// random letters, which HPACK cannot shrink below about 60%: a block of more
// than 16 KiB goes out as HEADERS and CONTINUATION frames.
func padding(size, each int) [][2]string {
	rng := rand.New(rand.NewPCG(uint64(size), uint64(each)))
	var md [][2]string
	for total, i := 0, 0; total < size; i++ {
		name := fmt.Sprintf("x-pad-%02d", i)
		n := max(1, min(each, size-total-len(name)-32))
		v := make([]byte, n)
		for j := range v {
			v[j] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"[rng.IntN(52)]
		}
		md = append(md, [2]string{name, string(v)})
		total += len(name) + n + 32
	}
	return md
}

// TestHeaderLists: a call with 60 KiB of metadata (under the daemon's
// 64 KiB header list limit, counting the client's own headers), and three
// over it: 70 KiB in fields of 4000 bytes, one value of 70 KiB, and 300 KiB
// in fields of 4000 bytes; all sent while another call on the same
// connection is held by the daemon. The 60 KiB call is answered. A call
// over the limit is refused for itself alone when the daemon advertised a
// SETTINGS_MAX_HEADER_LIST_SIZE it exceeds (the direct transport: 64 KiB),
// and answered when it advertised none (grpc-go, whose own limit is
// 16 MiB). Either way the held call, and the next call, are answered on the
// same connection.
func TestHeaderLists(t *testing.T) {
	near := padding(60<<10, 4000)
	overs := []struct {
		name string
		md   [][2]string
	}{
		{"70 KiB in fields of 4000 bytes", padding(70<<10, 4000)},
		{"one value of 70 KiB", padding(70<<10, 70<<10)},
		{"300 KiB in fields of 4000 bytes", padding(300<<10, 4000)},
	}
	forEachTransport(t, func(t *testing.T, d *daemon) {
		for _, client := range grpcClients {
			t.Run(client, func(t *testing.T) {
				tp := newTap(t, d.grpcAddr)
				held := rq(ds("held", "headers-"+client))
				open := rq(ds("open", "headers"))
				concurrent := []call{
					one(held), // held about a second
					{Req: open, Metadata: near},
				}
				for _, o := range overs {
					concurrent = append(concurrent, call{Req: open, Metadata: o.md})
				}
				p := plan{Target: tp.addr(), Steps: []step{
					calls(false, one(held)), // the one token
					calls(true, concurrent...),
					calls(false, one(open)),
				}}
				r := runPlan(t, client, p, stall)
				heldOK := answered(codeOK, okRemaining(0, perSecond(1)))
				expect(t, client+" (the token)", r.results(t, 0), []want{heldOK})
				got := r.results(t, 1)
				if len(got) != len(concurrent) {
					t.Fatalf("%d results, want %d", len(got), len(concurrent))
				}
				if m := heldOK.mismatch(got[0]); m != "" {
					t.Errorf("the held call, in flight beside the large header lists: %s", m)
				}
				if m := answered(codeOK, unlimited).mismatch(got[1]); m != "" {
					t.Errorf("the call with 60 KiB of metadata: %s", m)
				}
				advertised, ok := tp.setting(http2.SettingMaxHeaderListSize)
				for i, o := range overs {
					res := got[2+i]
					switch {
					case ok && codes.Code(res.Code) == codes.OK:
						t.Errorf("the call with %s was answered, beyond the daemon's advertised limit of %d", o.name, advertised)
					case ok && codes.Code(res.Code) == codes.Unavailable:
						t.Errorf("the call with %s: %s, want an error for the call alone", o.name, res)
					case !ok:
						if m := answered(codeOK, unlimited).mismatch(res); m != "" {
							t.Errorf("the call with %s, with no limit advertised: %s", o.name, m)
						}
					}
				}
				expect(t, client+" (after)", r.results(t, 2), []want{answered(codeOK, unlimited)})
				var sizes []int
				for _, c := range tp.calls() {
					sizes = append(sizes, c.headerBytes)
				}
				t.Logf("header lists on the wire (bytes): %v; the daemon's SETTINGS_MAX_HEADER_LIST_SIZE: %d (sent: %v)", sizes, advertised, ok)
				if n := tp.connections(); n != 1 {
					t.Errorf("%d connections, want 1: a large header list cost the connection", n)
				}
				if g := tp.goaways(false); len(g) > 0 {
					t.Errorf("the daemon sent GOAWAY %+v", g)
				}
				if n := tp.frames(true, http2.FrameContinuation); n == 0 {
					t.Errorf("%s sent no CONTINUATION frame", client)
				}
			})
		}
	})
}

// TestContinuation: nghttp sends a request whose header block (about
// 40 KB) is larger than a frame, as HEADERS and CONTINUATION frames.
func TestContinuation(t *testing.T) {
	r := rq(ds("open", "continuation"))
	forEachTransport(t, func(t *testing.T, d *daemon) {
		need(t, nghttp)
		tp := newTap(t, d.grpcAddr)
		args := append([]string{"-d", writeBody(t, r.body())}, grpcHeaders...)
		for _, f := range padding(40<<10, 4000) {
			args = append(args, "-H", f[0]+": "+f[1])
		}
		if out, stderr, err := runTool(t, stall, nil, "nghttp", append(args, tp.url())...); err != nil {
			t.Fatalf("nghttp: %v\n%s\n%s", err, clip(out, 2000), stderr)
		}
		if n := tp.frames(true, http2.FrameContinuation); n < 2 {
			t.Errorf("nghttp sent %d CONTINUATION frames, want 2 or more", n)
		}
		checkTapCalls(t, tp, 1, answered(codeOK, unlimited))
	})
}
