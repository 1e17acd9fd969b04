package main

import (
	"fmt"
	"io"
	"strings"
)

// report is everything one run measured.
type report struct {
	settings              settings
	loadBefore, loadAfter string
	idleRLS, idleRLQS     sample
	rls, rlqs             []sample
	rlsLate, rlsMissed    uint64
	rlsWorkers            int
	acc                   accuracyResult
}

// summary is one protocol's medians over the rounds.
type summary struct {
	offered, admitted, cpu, ns float64
}

func summarize(v []sample) summary {
	var o, a, c, n []float64
	for _, s := range v {
		o = append(o, s.perSecond(float64(s.offered)))
		a = append(a, s.perSecond(float64(s.admitted)))
		c = append(c, s.cpuPerSecond())
		n = append(n, s.nsPerAdmitted())
	}
	return summary{median(o), median(a), median(c), median(n)}
}

func (r *report) write(w io.Writer) {
	s := r.settings
	fmt.Fprintf(w, "# rlqsbench: %d Envoys, limit %d/s, %.0f/s offered; warm-up %s, window %s, %d rounds\n\n",
		s.envoys, s.limit, s.offered, s.warmup, s.window, s.rounds)
	fmt.Fprintf(w, "load average before: %s; after: %s\n\n", r.loadBefore, r.loadAfter)
	r.writeCPU(w)
	r.writeAccuracy(w)
}

func (r *report) writeCPU(w io.Writer) {
	fmt.Fprintln(w, "| round | protocol | offered/s | admitted/s | daemon CPU-s/s | daemon CPU-ns per admitted |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	row := func(round, proto string, s sample) {
		fmt.Fprintf(w, "| %s | %s | %.0f | %.0f | %.4f | %s |\n", round, proto,
			s.perSecond(float64(s.offered)), s.perSecond(float64(s.admitted)), s.cpuPerSecond(), ns(s.nsPerAdmitted()))
	}
	row("idle", "RLS daemon", r.idleRLS)
	row("idle", "RLQS daemon", r.idleRLQS)
	for i := range r.rls {
		row(fmt.Sprint(i+1), "RLS", r.rls[i])
		row(fmt.Sprint(i+1), "RLQS", r.rlqs[i])
	}
	a, b := summarize(r.rls), summarize(r.rlqs)
	for _, x := range []struct {
		name string
		s    summary
	}{{"RLS", a}, {"RLQS", b}} {
		fmt.Fprintf(w, "| median | %s | %.0f | %.0f | %.4f | %s |\n", x.name, x.s.offered, x.s.admitted, x.s.cpu, ns(x.s.ns))
	}
	fmt.Fprintf(w, "| RLQS / RLS | | | | %.4f | %.4f |\n\n", b.cpu/a.cpu, b.ns/a.ns)
	fmt.Fprintf(w, "RLS: loadgen open loop, %d workers over %d connections; %d calls sent late, %d not sent (all windows).\n\n",
		r.rlsWorkers, r.settings.envoys, r.rlsLate, r.rlsMissed)
}

func ns(v float64) string {
	if v != v {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}

func (r *report) writeAccuracy(w io.Writer) {
	s, a := r.settings, r.acc
	fmt.Fprintf(w, "## accuracy: L = %d/s, %.0f/s offered (80%% on one of %d Envoys), counted from %s for %s\n\n",
		s.accLimit, a.offered, s.envoys, s.settle, s.accWindow)
	fmt.Fprintln(w, "| protocol | busiest 1 s | % of L | at | mean admitted/s | % of L |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, x := range []struct {
		name string
		a    accuracy
	}{{"RLS", a.rls}, {"RLQS", a.rlqs}} {
		fmt.Fprintf(w, "| %s | %d | %.1f%% | %s | %.1f | %.1f%% |\n", x.name, x.a.busiest, x.a.busiestPct(),
			x.a.at+s.settle, x.a.mean, x.a.meanPct())
	}
	fmt.Fprintf(w, "\nadmitted per Envoy over the whole phase: RLS %s; RLQS %s; RLS calls failed: %d\n",
		join(a.rlsOK), join(a.rlqsTotal), a.rlsFailed)
}

func join(v []uint64) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = fmt.Sprint(n)
	}
	return strings.Join(s, ", ")
}
