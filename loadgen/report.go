package loadgen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// WriteTable writes r for people: what ran, then one table row of figures, then
// CPU and error detail.
func (r Result) WriteTable(w io.Writer) error {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s, %d workers, %d conn/target: %s\n", loopDesc(r), r.Concurrency, r.ConnsPerTarget, strings.Join(r.Targets, " "))
	fmt.Fprintf(&b, "%s, cardinality %d (round-robin), domain %q, hits_addend %d\n",
		shapeDesc(r), r.Cardinality, r.Domain, r.HitsAddend)
	fmt.Fprintf(&b, "window %s", fmtDur(r.Elapsed))
	if r.Warmup > 0 {
		fmt.Fprintf(&b, " after %s warmup", fmtDur(r.Warmup))
	}
	if r.Interrupted {
		b.WriteString(" (interrupted: partial figures)")
	}
	b.WriteString("\n\n")

	tw := tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "req/s\trequests\tok\tover_limit\tunknown\terrors\tp50\tp90\tp99\tp99.9\tmax")
	fmt.Fprintf(tw, "%.0f\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\n",
		r.Throughput, r.Requests, r.OK, r.OverLimit, r.Unknown, r.Errors,
		fmtDur(r.Latency.P50), fmtDur(r.Latency.P90), fmtDur(r.Latency.P99), fmtDur(r.Latency.P999), fmtDur(r.Latency.Max))
	_ = tw.Flush() // writes to a bytes.Buffer cannot fail
	b.WriteString("\n")

	if r.Server != nil {
		fmt.Fprintf(&b, "server cpu  pid %d: %s, %s/decision\n", r.Server.PID, fmtDur(r.Server.Total), fmtDur(r.Server.PerDecision))
	}
	fmt.Fprintf(&b, "client cpu  %s, %s/request\n", fmtDur(r.Client.Total), fmtDur(r.Client.PerDecision))
	if r.Loop == "open" {
		fmt.Fprintf(&b, "schedule    late %d, missed %d\n", r.Late, r.Missed)
	}
	if len(r.ErrorsByCode) > 0 {
		fmt.Fprintf(&b, "errors      %s\n", fmtCodes(r.ErrorsByCode))
	}
	_, err := w.Write(b.Bytes())
	return err
}

// WriteJSON writes r as one indented JSON object. Durations are integer
// nanoseconds, in fields ending in _ns.
func (r Result) WriteJSON(w io.Writer) error { return writeJSON(w, r) }

// WriteTable writes c for people: one row per run in the order they ran, then
// each side's medians, then B/A of the medians.
func (c Comparison) WriteTable(w io.Writer) error {
	var b bytes.Buffer
	side := func(s SideResult) string {
		d := s.Label + " = " + strings.Join(s.Targets, " ")
		if s.ServerPID != 0 {
			d += " (pid " + strconv.Itoa(s.ServerPID) + ")"
		}
		return d
	}
	fmt.Fprintf(&b, "A: %s\nB: %s\n", side(c.A), side(c.B))
	if len(c.A.Runs) > 0 {
		r := c.A.Runs[0]
		fmt.Fprintf(&b, "%s, %d workers, %d conn/target; %s, cardinality %d; %d rounds\n",
			loopDesc(r), r.Concurrency, r.ConnsPerTarget, shapeDesc(r), r.Cardinality, c.Rounds)
	}
	b.WriteString("\n")

	tw := tabwriter.NewWriter(&b, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "round\tside\treq/s\tok\tover_limit\terrors\tp50\tp90\tp99\tp99.9\tmax\tsrv_cpu/dec")
	for i := range max(len(c.A.Runs), len(c.B.Runs)) {
		for _, s := range []SideResult{c.A, c.B} {
			if i >= len(s.Runs) {
				continue
			}
			r := s.Runs[i]
			cpu := "-"
			if r.Server != nil {
				cpu = fmtDur(r.Server.PerDecision)
			}
			fmt.Fprintf(tw, "%d\t%s\t%.0f\t%d\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n",
				i+1, s.Label, r.Throughput, r.OK, r.OverLimit, r.Errors+r.Unknown,
				fmtDur(r.Latency.P50), fmtDur(r.Latency.P90), fmtDur(r.Latency.P99), fmtDur(r.Latency.P999), fmtDur(r.Latency.Max), cpu)
		}
	}
	for _, s := range []SideResult{c.A, c.B} {
		m := s.Median
		cpu := "-"
		if m.ServerCPUPerDecision > 0 {
			cpu = fmtDur(m.ServerCPUPerDecision)
		}
		fmt.Fprintf(tw, "median\t%s\t%.0f\t\t\t\t%s\t%s\t%s\t%s\t%s\t%s\n",
			s.Label, m.Throughput, fmtDur(m.P50), fmtDur(m.P90), fmtDur(m.P99), fmtDur(m.P999), fmtDur(m.Max), cpu)
	}
	fmt.Fprintf(tw, "B/A\t\t%s\t\t\t\t%s\t\t%s\t\t\t%s\n",
		fmtRatio(c.Ratio.Throughput), fmtRatio(c.Ratio.P50), fmtRatio(c.Ratio.P99), fmtRatio(c.Ratio.ServerCPUPerDecision))
	_ = tw.Flush() // writes to a bytes.Buffer cannot fail
	_, err := w.Write(b.Bytes())
	return err
}

// WriteJSON writes c as one indented JSON object.
func (c Comparison) WriteJSON(w io.Writer) error { return writeJSON(w, c) }

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func loopDesc(r Result) string {
	if r.Loop == "open" {
		return fmt.Sprintf("open loop at %g req/s", r.Rate)
	}
	return "closed loop"
}

func fmtRatio(f float64) string {
	if f == 0 {
		return "-"
	}
	return fmt.Sprintf("%.3fx", f)
}

func fmtCodes(m map[string]uint64) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	slices.Sort(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return strings.Join(parts, ", ")
}

// fmtDur prints a duration with three or four significant figures in the unit
// that suits it.
func fmtDur(d time.Duration) string {
	switch {
	case d < time.Microsecond:
		return strconv.FormatInt(int64(d), 10) + "ns"
	case d < time.Millisecond:
		return strconv.FormatFloat(float64(d)/float64(time.Microsecond), 'f', 1, 64) + "µs"
	case d < time.Second:
		return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', 2, 64) + "ms"
	default:
		return strconv.FormatFloat(d.Seconds(), 'f', 2, 64) + "s"
	}
}

// shapeDesc says what each request carries.
func shapeDesc(r Result) string {
	if r.Shape == ShapeMix {
		return "mix (3 descriptors, a 4th on 1 request in 10)"
	}
	return fmt.Sprintf("%s x %d descriptor(s)", r.Shape, r.Descriptors)
}
