package e2e

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sharelimit/sharelimit/internal/envoymodel"
	"github.com/sharelimit/sharelimit/internal/monotime"
)

// RLQS with real daemons (issue 33): each daemon has model Envoys
// (internal/envoymodel, whose behaviour comes from Envoy's source) on its
// StreamRateLimitQuotas, as the Envoys of its node would, enforcing their
// assignments in their own processes. What the cluster admits is counted by
// the models, on one clock, in 100 ms slots.

const (
	// rlqsLimit is L, per second, for generic_key=cluster.
	rlqsLimit = 300
	// rlqsSettle is when the checked windows begin: a few of Envoy's 5 s
	// reports and demand sharing's divisions after the start.
	rlqsSettle = 25 * time.Second
)

// rlqsEnvoy is one model Envoy and the load it is offered.
type rlqsEnvoy struct {
	m    *envoymodel.Model
	rate atomic.Uint64 // requests a second offered, as float64 bits
}

func (e *rlqsEnvoy) setRate(r float64) { e.rate.Store(math.Float64bits(r)) }
func (e *rlqsEnvoy) getRate() float64  { return math.Float64frombits(e.rate.Load()) }

// denyAll is the closed-cap setting the README recommends for Envoy.
func denyAll() *typev3.RateLimitStrategy {
	return &typev3.RateLimitStrategy{Strategy: &typev3.RateLimitStrategy_BlanketRule_{BlanketRule: typev3.RateLimitStrategy_DENY_ALL}}
}

// rlqsEnvoys connects n model Envoys to each daemon of c, on one clock.
func rlqsEnvoys(t *testing.T, ctx context.Context, c *cluster, n int, clock monotime.Clock) [][]*rlqsEnvoy {
	t.Helper()
	out := make([][]*rlqsEnvoy, len(c.daemons))
	for i, d := range c.daemons {
		if d == nil {
			continue
		}
		for range n {
			out[i] = append(out[i], newRLQSEnvoy(t, ctx, d.grpcAddr, clock))
		}
	}
	return out
}

// newRLQSEnvoy runs one model Envoy whose RLQS server is at addr. Its
// connection redials at once when it is lost, as Envoy's connection pool
// does when the next report opens a stream; grpc-go's own back-off (up to
// two minutes) would measure the client, not the server.
func newRLQSEnvoy(t *testing.T, ctx context.Context, addr string, clock monotime.Clock) *rlqsEnvoy {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 100 * time.Millisecond,
			Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}, MinConnectTimeout: 2 * time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	m, err := envoymodel.New(envoymodel.Config{Conn: conn, Domain: "edge", NoAssignment: denyAll(),
		Expired: denyAll(), ExpiredTimeout: 10 * time.Second, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	go m.Run(ctx) //nolint:errcheck // ends with ctx
	return &rlqsEnvoy{m: m}
}

// offer drives every Envoy at its rate, in 10 ms steps, until ctx ends.
func offer(ctx context.Context, envoys [][]*rlqsEnvoy, id map[string]string) *sync.WaitGroup {
	var wg sync.WaitGroup
	for _, node := range envoys {
		for _, e := range node {
			wg.Add(1)
			go func() {
				defer wg.Done()
				tk := time.NewTicker(10 * time.Millisecond)
				defer tk.Stop()
				last, owed := time.Now(), 0.0
				for {
					select {
					case <-ctx.Done():
						return
					case now := <-tk.C:
						owed += e.getRate() * now.Sub(last).Seconds()
						last = now
						for ; owed >= 1; owed-- {
							e.m.Allow(id)
						}
					}
				}
			}()
		}
	}
	return &wg
}

// admitted sums the models' slots.
func admitted(envoys [][]*rlqsEnvoy) envoymodel.Slots {
	var s envoymodel.Slots
	for _, node := range envoys {
		for _, e := range node {
			s = s.Add(e.m.Admitted())
		}
	}
	return s
}

// TestRLQSSkewed: three daemons sharing L by demand, each with two model
// Envoys; 2L offered, 80% of it on one Envoy. Once settled, no one-second
// window admits more than L + 5%, and the cluster admits at least 90% of L.
func TestRLQSSkewed(t *testing.T) {
	const k = 3
	c := newCluster(t, k, configParams{Limit: rlqsLimit, Quota: 40})
	c.args = []string{"--rlqs", "--share-mode", "demand", "--demand-interval", demandInterval.String()}
	for i := range k {
		c.register(i)
	}
	c.startAll(k)
	c.awaitLeader("30 s after start", 30*time.Second)

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clock := monotime.New()
	start := clock()
	envoys := rlqsEnvoys(t, ctx, c, 2, clock)
	offered := 2.0 * rlqsLimit
	envoys[0][0].setRate(0.8 * offered)
	for i, node := range envoys {
		for j, e := range node {
			if i != 0 || j != 0 {
				e.setRate(0.2 * offered / 5)
			}
		}
	}
	wg := offer(ctx, envoys, map[string]string{"generic_key": "cluster"})
	const run = 50 * time.Second
	time.Sleep(run)
	for _, d := range c.daemons {
		t.Logf("%s /rlconfig:\n%s", d.node, rlqsSection(c, d))
	}
	cancel()
	wg.Wait()

	s := admitted(envoys)
	from := (start + int64(rlqsSettle)) / int64(envoymodel.SlotWidth)
	to := (start + int64(run)) / int64(envoymodel.SlotWidth)
	settled := s.Window(from, to)
	most, at := settled.MaxWindow(10)
	avg := settled.Mean()
	tb := newTable(fmt.Sprintf("RLQS: K=%d daemons × 2 model Envoys, L=%d/s, offered 2L, 80%% on one Envoy; from %s on", k, rlqsLimit, rlqsSettle),
		"busiest 1 s", "at", "mean admitted/s", "% of L")
	tb.add(float64(most), time.Duration(at-from)*envoymodel.SlotWidth+rlqsSettle, avg, 100*avg/rlqsLimit)
	tb.log(t)
	for i, node := range envoys {
		for j, e := range node {
			a, d := e.m.Totals()
			t.Logf("node%d envoy%d: offered %.0f/s, allowed %d, denied %d; admitted by second: %v", i+1, j+1, e.getRate(), a, d, perSecond(e.m.Admitted().Window(start/int64(envoymodel.SlotWidth), to)))
		}
	}
	if float64(most) > 1.05*rlqsLimit {
		t.Errorf("a one-second window admitted %d, more than L + 5%% (%.0f)", most, 1.05*rlqsLimit)
	}
	if avg < 0.9*rlqsLimit {
		t.Errorf("admitted %.1f/s once settled, less than 90%% of L (%.0f)", avg, 0.9*rlqsLimit)
	}
}

// rlqsSection is the RLQS part of d's /rlconfig text, for the log.
func rlqsSection(c *cluster, d *daemon) string {
	resp, err := c.admin.Get("http://" + d.httpAddr + "/rlconfig")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	text := string(b)
	if i := strings.Index(strings.ToLower(text), "rlqs"); i >= 0 {
		return text[i:]
	}
	return text
}

// perSecond sums slots ten by ten.
func perSecond(s envoymodel.Slots) []uint64 {
	out := make([]uint64, (len(s.Counts)+9)/10)
	for i, n := range s.Counts {
		out[i/10] += n
	}
	return out
}
