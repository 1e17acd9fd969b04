// Package chart renders a rate time series as a self-contained SVG chart:
// the aggregate admitted rate against the limit, each replica's admitted
// rate, the number of replicas as a step on its own axis, and marked events.
// It uses the standard library only, and the SVG references no external
// asset, so it renders the same on GitHub, in a browser or in an editor.
//
// Why a package: the e2e scale-up test's series (tools/chart) and
// sharelimit simulate draw the same kind of picture, with the same code.
//
// It must never read or write a file or reach the network (its callers read
// the series and write the SVG), and never fill in what a Series lacks: a
// Series that Validate refuses is not drawn.
//
// The JSON form of a Series:
//
//	{
//	  "title": "...",
//	  "bin_seconds": 0.2,              // width of each bin
//	  "offered": 600,                  // offered load, req/s (informational)
//	  "t": [0, 0.2, ...],              // start of each bin, seconds
//	  "limit": [300, ...],             // the global limit in force, req/s
//	  "aggregate": [600, ...],         // admitted by all replicas, req/s
//	  "replicas": [2, ...],            // passing instances in the catalog
//	  "per_replica": [{"name": "node1", "admitted": [...]}, ...],
//	  "events": [{"t": 4.0, "label": "catalog: 2 → 4 instances"}]
//	}
package chart

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"math"
	"strings"
)

// Series is a chart's input; see the package comment for its JSON form.
type Series struct {
	Title      string    `json:"title"`
	BinSeconds float64   `json:"bin_seconds"`
	Offered    float64   `json:"offered"`
	T          []float64 `json:"t"`
	Limit      []float64 `json:"limit"`
	Aggregate  []float64 `json:"aggregate"`
	Replicas   []int     `json:"replicas"`
	PerReplica []struct {
		Name     string    `json:"name"`
		Admitted []float64 `json:"admitted"`
	} `json:"per_replica"`
	Events []struct {
		T     float64 `json:"t"`
		Label string  `json:"label"`
	} `json:"events"`
}

// Validate checks that every series has one value per bin.
func (ts *Series) Validate() error {
	n := len(ts.T)
	var errs []error
	if n == 0 {
		errs = append(errs, errors.New("no bins"))
	}
	if !(ts.BinSeconds > 0) {
		errs = append(errs, fmt.Errorf("bin_seconds %v is not positive", ts.BinSeconds))
	}
	check := func(name string, got int) {
		if got != n {
			errs = append(errs, fmt.Errorf("%s has %d values for %d bins", name, got, n))
		}
	}
	check("limit", len(ts.Limit))
	check("aggregate", len(ts.Aggregate))
	check("replicas", len(ts.Replicas))
	for _, r := range ts.PerReplica {
		check("per_replica "+r.Name, len(r.Admitted))
	}
	return errors.Join(errs...)
}

// Geometry of the chart, in SVG user units. The rates are plotted in the
// main panel; the instance count gets a strip of its own under it, on the
// same time axis, so that no step of it can be mistaken for a rate.
const (
	width   = 960
	height  = 560
	left    = 72 // room for the vertical axes
	right   = 24
	top     = 84 // room for the title and the legend
	bottom  = 52 // room for the time axis
	plotW   = width - left - right
	gap     = 14 // between the panel and the strip
	stripH  = 64
	mainTop = top
	mainH   = height - top - bottom - gap - stripH
	stripY  = mainTop + mainH + gap
	axisY   = stripY + stripH // where the time axis runs
	fontCSS = "font-family:Helvetica,Arial,sans-serif"
)

// Colours: the aggregate and the limit stand out; the replicas are thinner.
const (
	colAggregate = "#1f4e9c"
	colLimit     = "#c62828"
	colInstances = "#555555"
	colEvent     = "#333333"
	colGrid      = "#e4e4e4"
	colOffered   = "#777777"
	colAxis      = "#222222"
)

// replicaColour is the line colour of replica i.
func replicaColour(i int) string {
	colours := [...]string{"#2e9c4a", "#f08c00", "#8e5cc4", "#00a3b4", "#c2185b", "#827717", "#6d4c41", "#455a64"}
	return colours[i%len(colours)]
}

// Render writes the chart as SVG. ts must be valid (Validate).
func Render(w *bytes.Buffer, ts *Series) {
	n := len(ts.T)
	xMax := ts.T[n-1] + ts.BinSeconds
	yTop := ts.Offered
	for i := range n {
		yTop = max(yTop, ts.Aggregate[i], ts.Limit[i])
		for _, r := range ts.PerReplica {
			yTop = max(yTop, r.Admitted[i])
		}
	}
	yStep := niceStep(yTop*1.1, 6)
	yMax := math.Ceil(yTop*1.1/yStep) * yStep
	rMax := 1
	for _, r := range ts.Replicas {
		rMax = max(rMax, r)
	}
	x := func(t float64) float64 { return left + t/xMax*plotW }
	y := func(v float64) float64 { return mainTop + mainH - v/yMax*mainH }
	// The strip leaves a little room above its highest step.
	yr := func(v float64) float64 { return stripY + stripH - v/float64(rMax)*(stripH-12) }

	fmt.Fprintf(w, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-labelledby="title desc">`+"\n", width, height, width, height)
	fmt.Fprintf(w, "<title id=\"title\">%s</title>\n", esc(ts.Title))
	fmt.Fprintf(w, "<desc id=\"desc\">Admitted requests per second, in bins of %g s: the cluster's aggregate against the global limit, and each replica. Below, the number of passing instances in the catalog.</desc>\n", ts.BinSeconds)
	fmt.Fprintf(w, "<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", width, height)
	fmt.Fprintf(w, "<g style=\"%s\" font-size=\"12\" fill=\"%s\">\n", fontCSS, colAxis)
	fmt.Fprintf(w, "<text x=\"%d\" y=\"26\" font-size=\"17\" font-weight=\"bold\" text-anchor=\"middle\">%s</text>\n", width/2, esc(ts.Title))

	// The rate axis and its grid.
	for v := 0.0; v <= yMax+yStep/2; v += yStep {
		fmt.Fprintf(w, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\"/>\n", left, y(v), left+plotW, y(v), colGrid)
		fmt.Fprintf(w, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%s</text>\n", left-8, y(v)+4, number(v))
	}
	fmt.Fprintf(w, "<text transform=\"translate(18 %d) rotate(-90)\" text-anchor=\"middle\">admitted requests per second</text>\n", mainTop+mainH/2)
	fmt.Fprintf(w, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"%s\"/>\n", left, mainTop, plotW, mainH, colAxis)

	// The instance strip: its own small axis, a shaded step, and a title.
	for _, v := range []int{0, rMax} {
		fmt.Fprintf(w, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\" fill=\"%s\">%d</text>\n", left-8, yr(float64(v))+4, colInstances, v)
	}
	fmt.Fprintf(w, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"%s\"/>\n", left, stripY, plotW, stripH, colAxis)
	counts := make([]float64, n)
	for i, r := range ts.Replicas {
		counts[i] = float64(r)
	}
	step := stepPath(ts.T, ts.BinSeconds, counts, x, yr)
	fmt.Fprintf(w, "<path d=\"%s V%.1f H%.1f Z\" fill=\"%s\" fill-opacity=\"0.12\" stroke=\"none\"/>\n", step, yr(0), x(ts.T[0]), colInstances)
	fmt.Fprintf(w, "<path d=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\"/>\n", step, colInstances)
	// Label each level where it starts, so the strip reads without an axis.
	for i := range n {
		if i == 0 || ts.Replicas[i] != ts.Replicas[i-1] {
			fmt.Fprintf(w, "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">%d</text>\n", x(ts.T[i])+7, yr(counts[i])-3, colInstances, ts.Replicas[i])
		}
	}
	fmt.Fprintf(w, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" fill=\"%s\">passing instances in the catalog</text>\n", left+plotW-6, stripY+stripH-6, colInstances)

	// The time axis, under the strip.
	xStep := niceStep(xMax, 10)
	for t := 0.0; t <= xMax+1e-9; t += xStep {
		fmt.Fprintf(w, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\"/>\n", x(t), axisY, x(t), axisY+5, colAxis)
		fmt.Fprintf(w, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", x(t), axisY+19, number(t))
	}
	fmt.Fprintf(w, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">seconds since the load started</text>\n", left+plotW/2, height-10)

	// The offered load, for reference.
	if ts.Offered > 0 {
		fmt.Fprintf(w, "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"1.2\" stroke-dasharray=\"1 3\"/>\n",
			left, y(ts.Offered), left+plotW, y(ts.Offered), colOffered)
	}
	// Rates: each replica, then the limit and the aggregate on top. Replicas
	// with equal shares draw the same line; each is drawn a little thinner
	// than the one before, so those underneath still show at its edges.
	for i, r := range ts.PerReplica {
		fmt.Fprintf(w, "<path d=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"%.2f\"/>\n",
			stepPath(ts.T, ts.BinSeconds, r.Admitted, x, y), replicaColour(i), replicaWidth(i, len(ts.PerReplica)))
	}
	fmt.Fprintf(w, "<path d=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\" stroke-dasharray=\"8 5\"/>\n",
		stepPath(ts.T, ts.BinSeconds, ts.Limit, x, y), colLimit)
	fmt.Fprintf(w, "<path d=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"2.6\"/>\n",
		stepPath(ts.T, ts.BinSeconds, ts.Aggregate, x, y), colAggregate)

	// Events: a dashed line across both panels each, labels staggered so
	// they never overlap when events are close together.
	for i, e := range ts.Events {
		ex := x(e.T)
		fmt.Fprintf(w, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\" stroke-dasharray=\"3 3\"/>\n", ex, mainTop, ex, axisY, colEvent)
		fmt.Fprintf(w, "<text x=\"%.1f\" y=\"%d\" fill=\"%s\">%s</text>\n", ex+5, mainTop+16+14*i, colEvent, esc(e.Label))
	}

	// The legend, under the title.
	type item struct{ label, colour, dash, width string }
	items := []item{
		{"aggregate admitted", colAggregate, "", "2.6"},
		{"global limit", colLimit, "8 5", "2"},
	}
	for i, r := range ts.PerReplica {
		items = append(items, item{r.Name + " admitted", replicaColour(i), "", fmt.Sprintf("%.2f", replicaWidth(i, len(ts.PerReplica)))})
	}
	if ts.Offered > 0 {
		items = append(items, item{"offered", colOffered, "1 3", "1.2"})
	}
	// Text width is estimated (no font metrics without a renderer) at a
	// generous 6.6 units per character of the 12-unit font; a row that would
	// run past the plot wraps.
	lx, ly := float64(left), 50
	for _, it := range items {
		wide := 30 + 6.6*float64(len([]rune(it.label))) + 20
		if lx > left && lx+wide-20 > left+plotW {
			lx, ly = left, ly+18
		}
		fmt.Fprintf(w, "<line x1=\"%.1f\" y1=\"%d\" x2=\"%.1f\" y2=\"%d\" stroke=\"%s\" stroke-width=\"%s\"", lx, ly, lx+24, ly, it.colour, it.width)
		if it.dash != "" {
			fmt.Fprintf(w, " stroke-dasharray=\"%s\"", it.dash)
		}
		w.WriteString("/>\n")
		fmt.Fprintf(w, "<text x=\"%.1f\" y=\"%d\">%s</text>\n", lx+30, ly+4, esc(it.label))
		lx += wide
	}
	w.WriteString("</g>\n</svg>\n")
}

// replicaWidth is the stroke width of replica i of n: from 3.4 for the first
// down to 1.2 for the last.
func replicaWidth(i, n int) float64 {
	if n <= 1 {
		return 1.6
	}
	return 3.4 - 2.2*float64(i)/float64(n-1)
}

// stepPath is an SVG path drawing vs as a step function: each value holds
// over its whole bin, which is what a count per bin means.
func stepPath(ts []float64, bin float64, vs []float64, x, y func(float64) float64) string {
	var b strings.Builder
	fmt.Fprintf(&b, "M%.1f %.1f", x(ts[0]), y(vs[0]))
	for i := range vs {
		if i > 0 {
			fmt.Fprintf(&b, " V%.1f", y(vs[i]))
		}
		fmt.Fprintf(&b, " H%.1f", x(ts[i]+bin))
	}
	return b.String()
}

// niceStep returns a tick step of 1, 2 or 5 times a power of ten that cuts
// [0, span] into at most about n intervals.
func niceStep(span float64, n int) float64 {
	if !(span > 0) {
		return 1
	}
	raw := span / float64(n)
	p := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= raw {
			return m * p
		}
	}
	return 10 * p
}

// number formats a tick label without trailing zeros.
func number(v float64) string {
	if math.Abs(v-math.Round(v)) < 1e-9 {
		return fmt.Sprintf("%.0f", v)
	}
	return strings.TrimRight(strings.TrimRight(fmt.Sprintf("%.2f", v), "0"), ".")
}

// esc escapes text for SVG.
func esc(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s))
	return b.String()
}
