package simulate

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/internal/chart"
)

// Summary is a run's figures after warm-up.
type Summary struct {
	Mean   float64 // admitted ÷ L, averaged
	Worst  float64 // the most one second admitted, ÷ L
	Lowest float64 // the least one second admitted, ÷ L
}

// Summarize is r's figures from warm-up on, as fractions of L; the admitted
// rate is also capped by what was offered, so Mean is against min(L, offered).
func (r *Result) Summarize(warmup time.Duration) Summary {
	from := min(int(warmup/time.Second), len(r.Bins)-1)
	s := Summary{Lowest: 1e300}
	var sum float64
	for _, b := range r.Bins[from:] {
		f := b.Admitted / r.Config.Limit
		sum += f
		s.Worst = max(s.Worst, f)
		s.Lowest = min(s.Lowest, f)
	}
	s.Mean = sum / float64(len(r.Bins)-from)
	return s
}

// WriteTable prints equal and demand runs of one scenario side by side, a
// row per second, then their summaries and demand sharing's Consul load.
func WriteTable(w io.Writer, equal, dem *Result) {
	c := dem.Config
	fmt.Fprintf(w, "K=%d replicas, L=%g/s, offered %g/s, shape %s, %s, --demand-interval %s, --demand-max-writes %g",
		c.Replicas, c.Limit, c.Offered, c.Shape, c.Duration, c.Interval, c.MaxWrites)
	for _, e := range c.Events {
		fmt.Fprintf(w, ", %+d replicas at %s", e.Delta, e.At)
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "t (s)\treplicas\toffered ÷ L\tequal: admitted ÷ L\tdemand: admitted ÷ L\tdemand: writes/s\t")
	for i, b := range dem.Bins {
		e := equal.Bins[i]
		fmt.Fprintf(tw, "%d\t%d\t%.3f\t%.3f\t%.3f\t%d\t\n", int(b.T/time.Second), b.Replicas, b.Offered/c.Limit, e.Admitted/c.Limit, b.Admitted/c.Limit, b.Writes)
	}
	tw.Flush()
	se, sd := equal.Summarize(5*time.Second), dem.Summarize(5*time.Second)
	fmt.Fprintf(w, "from 5 s on, admitted ÷ L: equal shares mean %.3f (worst second %.3f); demand shares mean %.3f (worst second %.3f, lowest %.3f)\n",
		se.Mean, se.Worst, sd.Mean, sd.Worst, sd.Lowest)
	fmt.Fprintf(w, "the shares in force never summed past %.6f of L\n", dem.MaxShareSum)
	burst := c.Burst
	if burst == 0 {
		burst = c.Limit
	}
	if small := burst * demand.DefaultFloor / float64(c.Replicas); small < 1 {
		fmt.Fprintf(w, "note: a replica at the floor of its share holds B × %.2g / K = %.2g tokens, below 1: buckets hold at least 1 token, so the cluster holds more than B and may admit more than L for a while; raise the burst to at least %.0f (10 × K)\n",
			demand.DefaultFloor, small, 10*float64(c.Replicas))
	}
	fmt.Fprintf(w, "Consul, demand shares: %.1f report writes/s (budget %g), leader reads %s/s, parameters served %s/s (budget 1 MB/s); report %d B, parameters %d B\n",
		dem.WritesPerSecond, c.MaxWrites, bytesOf(dem.LeaderReadBytesPerS), bytesOf(dem.ParamsServedBytesPer), dem.ReportBytes, dem.ParamsBytes)
}

func bytesOf(b float64) string {
	switch {
	case b >= 1<<20:
		return fmt.Sprintf("%.2f MB", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

// SVG draws the demand run's aggregate against L, with the equal run's
// aggregate and the busiest replicas as lines, and the membership events
// marked.
func SVG(equal, dem *Result) ([]byte, error) {
	c := dem.Config
	s := chart.Series{
		Title: fmt.Sprintf("sharelimit simulate: K=%d, L=%g/s, offered %g/s, shape %s: admitted with demand shares (blue) and equal shares",
			c.Replicas, c.Limit, c.Offered, c.Shape),
		BinSeconds: 1,
		Offered:    c.Offered,
	}
	for i, b := range dem.Bins {
		s.T = append(s.T, float64(i))
		s.Limit = append(s.Limit, c.Limit)
		s.Aggregate = append(s.Aggregate, b.Admitted)
		s.Replicas = append(s.Replicas, b.Replicas)
	}
	add := func(name string, vs []float64) {
		s.PerReplica = append(s.PerReplica, struct {
			Name     string    `json:"name"`
			Admitted []float64 `json:"admitted"`
		}{name, vs})
	}
	eq := make([]float64, len(equal.Bins))
	for i, b := range equal.Bins {
		eq[i] = b.Admitted
	}
	add("equal shares, all replicas", eq)
	names := make([]string, 0, len(dem.PerReplica))
	for n := range dem.PerReplica {
		names = append(names, n)
	}
	slices.SortFunc(names, func(a, b string) int { return strings.Compare(pad(a), pad(b)) })
	for _, n := range names {
		add("demand, "+n, dem.PerReplica[n])
	}
	for _, e := range c.Events {
		s.Events = append(s.Events, struct {
			T     float64 `json:"t"`
			Label string  `json:"label"`
		}{e.At.Seconds(), fmt.Sprintf("%+d replicas", e.Delta)})
	}
	if c.Shape == Moving {
		for i := 1; i < 3; i++ {
			at := (c.Duration / 3 * time.Duration(i)).Seconds()
			s.Events = append(s.Events, struct {
				T     float64 `json:"t"`
				Label string  `json:"label"`
			}{at, "hot spot moves"})
		}
	}
	if err := s.Validate(); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	chart.Render(&b, &s)
	return b.Bytes(), nil
}

// pad makes node names sort by number.
func pad(name string) string { return fmt.Sprintf("%12s", name) }
