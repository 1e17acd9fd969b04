package simulate

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// goldenRuns are the runs whose every figure testdata/runs.golden holds: each
// shape, equal and demand shares, with and without membership events, and the
// corners (a small burst, a tight write budget, no hold, a thousand
// replicas) that take the other branches of Run.
func goldenRuns() []Config {
	var out []Config
	for _, shape := range Shapes {
		for _, demandOn := range []bool{false, true} {
			c := base(4, shape, demandOn)
			c.Duration = 12 * time.Second
			out = append(out, c)
			c.Replicas = 6
			c.Events = []Event{{At: 7 * time.Second, Delta: -2}, {At: 3 * time.Second, Delta: 3}}
			out = append(out, c)
		}
	}
	small := base(7, Zipf, true)
	small.Burst, small.Duration, small.Interval = 50, 10*time.Second, 250*time.Millisecond
	tight := base(60, Hot, true)
	tight.MaxWrites, tight.Duration = 5, 10*time.Second
	tight.Events = []Event{{At: 4 * time.Second, Delta: 40}}
	noHold := base(5, Moving, false)
	noHold.Hold, noHold.Duration = 0, 9*time.Second
	noHold.Events = []Event{{At: 2 * time.Second, Delta: -4}, {At: 5 * time.Second, Delta: 2}}
	large := base(1000, Hot, true)
	large.Limit, large.Offered, large.Duration = 20000, 30000, 6*time.Second
	return append(out, small, tight, noHold, large)
}

// TestGoldenRuns holds every figure of the golden runs, exactly: the
// simulator is what operators run before they deploy, and a change to its
// arithmetic must show as a diff (-update rewrites it).
func TestGoldenRuns(t *testing.T) {
	t.Parallel()
	var b strings.Builder
	for _, c := range goldenRuns() {
		r, err := Run(c)
		if err != nil {
			t.Fatal(err)
		}
		dumpResult(&b, r)
	}
	testutil.Golden(t, "testdata/runs.golden", b.String())
}

func dumpResult(b *strings.Builder, r *Result) {
	g := func(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }
	c := r.Config
	fmt.Fprintf(b, "run K=%d L=%s B=%s offered=%s shape=%s duration=%s demand=%t interval=%s max-writes=%s hold=%s events=%v\n",
		c.Replicas, g(c.Limit), g(c.Burst), g(c.Offered), c.Shape, c.Duration, c.Demand, c.Interval, g(c.MaxWrites), c.Hold, c.Events)
	for _, bin := range r.Bins {
		fmt.Fprintf(b, "  bin %s replicas=%d admitted=%s offered=%s writes=%d shares=%s\n",
			bin.T, bin.Replicas, g(bin.Admitted), g(bin.Offered), bin.Writes, g(bin.Shares))
	}
	names := make([]string, 0, len(r.PerReplica))
	for n := range r.PerReplica {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		vs := make([]string, len(r.PerReplica[n]))
		for i, v := range r.PerReplica[n] {
			vs[i] = g(v)
		}
		fmt.Fprintf(b, "  replica %s %s\n", n, strings.Join(vs, " "))
	}
	fmt.Fprintf(b, "  writes/s=%s leader-read B/s=%s params-served B/s=%s report B=%d params B=%d max-share-sum=%s\n",
		g(r.WritesPerSecond), g(r.LeaderReadBytesPerS), g(r.ParamsServedBytesPer), r.ReportBytes, r.ParamsBytes, g(r.MaxShareSum))
}
