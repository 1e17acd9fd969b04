package interop

import (
	"fmt"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// TestGracefulStop: C-core and grpc-js each keep 8 calls in flight while
// the daemon gets SIGTERM. Every call either completes or fails cleanly
// with UNAVAILABLE (nothing hangs, nothing else); the daemon exits 0; and
// once it is started again on the same port, the same channels reconnect
// and their calls succeed.
func TestGracefulStop(t *testing.T) {
	open := rq(ds("open", "stop"))
	forEachTransport(t, func(t *testing.T, d *daemon) {
		var lcs []*loadClient
		for _, client := range grpcClients {
			p := plan{Target: d.grpcAddr, Steps: []step{{Op: "load", Req: &open, Workers: 8, After: 50, TimeoutMs: 10000}}}
			lcs = append(lcs, startLoad(t, client, p, 2*time.Minute))
		}
		for _, lc := range lcs {
			select {
			case <-lc.loading:
			case <-time.After(stall):
				t.Fatalf("%s: no call succeeded within %s:\n%s", lc.client, stall, lc.output())
			}
		}
		time.Sleep(300 * time.Millisecond) // the load runs
		stopping := time.Now()
		if err := d.stop(30 * time.Second); err != nil {
			t.Fatalf("sharelimit (%s) exited with %v after SIGTERM under load:\n%s", d.transport, err, d.tail())
		}
		t.Logf("sharelimit exited %s after SIGTERM (--drain 1s)", time.Since(stopping).Round(time.Millisecond))
		d.restart()
		for _, lc := range lcs {
			if _, err := fmt.Fprintln(lc.stdin); err != nil {
				t.Fatalf("%s: %v:\n%s", lc.client, err, lc.output())
			}
		}
		for _, lc := range lcs {
			var counts loadCounts
			select {
			case counts = <-lc.result:
			case <-time.After(time.Minute):
				t.Fatalf("%s: not 50 successful calls within a minute of the restart:\n%s", lc.client, lc.output())
			}
			t.Logf("%s: codes before the restart %v, after %v", lc.client, counts.Before, counts.After)
			for phase, m := range map[string]map[string]int{"before": counts.Before, "after": counts.After} {
				for code, n := range m {
					if code != fmt.Sprint(int(codes.OK)) && code != fmt.Sprint(int(codes.Unavailable)) {
						t.Errorf("%s: %d calls %s the restart ended with code %s, want only OK or UNAVAILABLE", lc.client, n, phase, code)
					}
				}
			}
			if counts.After["0"] < 50 {
				t.Errorf("%s: %d successful calls after the restart, want 50", lc.client, counts.After["0"])
			}
		}
	}, withArgs("--drain", "1s"))
}
