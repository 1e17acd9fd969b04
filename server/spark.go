package server

import (
	"math"
	"strconv"
	"strings"

	"github.com/sharelimit/sharelimit/internal/human"
)

// Spark is one rule's sparkline: its history drawn as SVG polylines, with
// a vertical line where its share changed, a config was reloaded or a
// membership view changed. The page's template writes it as inline SVG; every
// figure here is a number, and the titles are escaped by the template.
type Spark struct {
	Rule, Label                     string
	W, H                            int
	Admitted, Over                  string // SVG path data: a bar a slot
	Shadow, Share                   string // polyline points
	AdmittedSum, OverSum, ShadowSum uint64
	// Marks are this rule's share changes, at most maxShareMarks (the
	// latest). The marks every rule shares (reloads, membership changes) are
	// drawn once a page (pageMarks) and used by reference (Shared).
	Marks  []SparkMark
	Shared bool
}

// SparkMark is a vertical line on a sparkline.
type SparkMark struct {
	X                  string
	Kind, Color, Title string
}

const (
	sparkStep = 4 // pixels a slot
	sparkH    = 40
	sparkPad  = 3 // pixels kept free above the highest point and below 0
)

// maxShareMarks bounds a sparkline's share-change marks: a rule whose share
// moves every slot would otherwise carry sixty.
const maxShareMarks = 12

var markColors = map[string]string{MarkReload: "#6a1b9a", MarkMembership: "#00897b", MarkShare: "#777"}

// newSpark draws rh, a rule of h. The time axis is always the full ten
// minutes and one slot in progress, so the sparklines of a page line up;
// a young daemon's history sits at the right. Counts are drawn as rates per
// second, so the slot in progress, shorter than a step, is not drawn low.
func newSpark(h *History, rh *RuleHistory) *Spark {
	n := len(h.Starts)
	slots := historySlots + 1
	off := slots - n
	s := &Spark{Rule: rh.Rule, W: slots * sparkStep, H: sparkH}
	secs := func(i int) float64 {
		if i == n-1 {
			return max(h.Partial, 1) // under a second, a rate would be mostly noise
		}
		return h.StepSeconds
	}
	peak, sharePeak := 0.0, 0.0
	for i := rh.From; i < n; i++ {
		peak = max(peak, float64(rh.Admitted[i]+rh.Over[i])/secs(i))
		sharePeak = max(sharePeak, rh.Share[i])
		s.AdmittedSum += rh.Admitted[i]
		s.OverSum += rh.Over[i]
		s.ShadowSum += rh.Shadow[i]
	}
	x := func(i int) float64 { return float64((off+i)*sparkStep) + sparkStep/2 }
	y := func(v, top float64) float64 {
		if top <= 0 {
			return sparkH - sparkPad
		}
		return sparkH - sparkPad - v/top*(sparkH-2*sparkPad)
	}
	// Admitted and over-limit are stacked bars, one a slot, so a single
	// slot (a young daemon's, or the one in progress) shows; shadow
	// over-limit, a part of admitted, is a line over them.
	var admitted, over strings.Builder
	for i := rh.From; i < n; i++ {
		a, o := float64(rh.Admitted[i])/secs(i), float64(rh.Over[i])/secs(i)
		left := float64((off + i) * sparkStep)
		bar(&admitted, left, y(0, peak), y(a, peak))
		bar(&over, left, y(a, peak), y(a+o, peak))
	}
	s.Admitted, s.Over = admitted.String(), over.String()
	if s.ShadowSum > 0 {
		var p polyline
		for i := rh.From; i < n; i++ {
			v := y(float64(rh.Shadow[i])/secs(i), peak)
			p.add(x(i)-sparkStep/2, v)
			p.add(x(i)+sparkStep/2, v)
		}
		s.Shadow = p.String()
	}
	var share polyline
	for i := rh.From; i < n; i++ {
		// A step: the share holds for the whole slot.
		yy := y(rh.Share[i], sharePeak)
		share.add(x(i)-sparkStep/2, yy)
		share.add(x(i)+sparkStep/2, yy)
		// A change is marked as the page shows shares: demand sharing moves
		// them by fractions no one could read.
		if i > rh.From {
			if was, is := human.Share(rh.Share[i-1]), human.Share(rh.Share[i]); was != is {
				s.Marks = append(s.Marks, SparkMark{X: fmt1(x(i) - sparkStep/2), Kind: MarkShare, Color: markColors[MarkShare],
					Title: "share " + was + " → " + is})
			}
		}
	}
	if len(s.Marks) > maxShareMarks {
		s.Marks = s.Marks[len(s.Marks)-maxShareMarks:]
	}
	s.Share = share.String()
	s.Shared = len(h.Marks) > 0
	s.Label = rh.Rule + ", last 10 minutes: " + human.Count(s.AdmittedSum) + " admitted, " + human.Count(s.OverSum) + " over limit, " +
		human.Count(s.ShadowSum) + " shadow over limit"
	return s
}

// pageMarks are the marks every rule's sparkline shares, on the sparklines'
// common time axis: the page draws them once and each sparkline uses them.
func pageMarks(h *History) []SparkMark {
	n := len(h.Starts)
	if n == 0 {
		return nil
	}
	off, w := historySlots+1-n, (historySlots+1)*sparkStep
	t0 := h.Starts[0]
	out := make([]SparkMark, 0, len(h.Marks))
	for _, m := range h.Marks {
		at := m.At.Sub(t0).Seconds() / h.StepSeconds
		xx := min(float64(off*sparkStep)+at*sparkStep, float64(w-1))
		title := m.Kind + " at " + m.At.UTC().Format("15:04:05")
		if m.Note != "" {
			title += ": " + m.Note
		}
		out = append(out, SparkMark{X: fmt1(xx), Kind: m.Kind, Color: markColors[m.Kind], Title: title})
	}
	return out
}

// polyline collects a polyline's points in whole pixels, leaving out the
// inner points of a level run, which draw nothing: an idle series is two
// points, so a page of a hundred sparklines stays small.
type polyline struct {
	xs, ys []int
}

func (p *polyline) add(x, y float64) {
	xi, yi := int(math.Round(x)), int(math.Round(y))
	if n := len(p.ys); n >= 2 && p.ys[n-1] == yi && p.ys[n-2] == yi {
		p.xs[n-1] = xi // extend the run
		return
	}
	p.xs, p.ys = append(p.xs, xi), append(p.ys, yi)
}

func (p *polyline) String() string {
	var b strings.Builder
	for i := range p.xs {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.Itoa(p.xs[i]))
		b.WriteByte(',')
		b.WriteString(strconv.Itoa(p.ys[i]))
	}
	return b.String()
}

// bar adds a slot's bar from y0 down to y1 (SVG's y grows downwards) to a
// path; nothing when it has no height.
func bar(b *strings.Builder, left, y0, y1 float64) {
	top, bottom := int(math.Round(y1)), int(math.Round(y0))
	if bottom-top < 1 {
		if y0-y1 <= 0 {
			return
		}
		top = bottom - 1 // a count too small for a pixel still shows
	}
	b.WriteString("M" + strconv.Itoa(int(left)) + " " + strconv.Itoa(bottom) + "v" + strconv.Itoa(top-bottom) + "h" + strconv.Itoa(sparkStep-1) + "v" + strconv.Itoa(bottom-top) + "z")
}

func fmt1(f float64) string { return strconv.FormatFloat(f, 'f', 1, 64) }
