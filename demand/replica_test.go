package demand

import (
	"math"
	"testing"
	"time"
)

func TestRates(t *testing.T) {
	var r Rates
	t0 := time.Unix(1000, 0)
	r.Update(0, 0, t0, 0)
	r.Update(100, 40, t0.Add(time.Second), 0) // tau 0: the last window only
	if r.Offered != 100 || r.Admitted != 40 {
		t.Fatalf("tau 0: %v/%v, want 100/40", r.Offered, r.Admitted)
	}
	// With tau = 1 s, a step from 100/s to 300/s reaches 1-1/e of the way
	// after one second, however the second is sampled.
	a, b := r, r
	a.Update(400, 40, t0.Add(2*time.Second), time.Second)
	for i := 1; i <= 10; i++ {
		b.Update(100+uint64(30*i), 40, t0.Add(time.Second+time.Duration(i)*100*time.Millisecond), time.Second)
	}
	want := 100 + 200*(1-math.Exp(-1))
	if math.Abs(a.Offered-want) > 1e-9 || math.Abs(b.Offered-want) > 1e-9 {
		t.Errorf("one sample %v, ten samples %v, want %v", a.Offered, b.Offered, want)
	}
	if a.Admitted >= 40 || a.Admitted <= 0 {
		t.Errorf("admitted decays toward 0: %v", a.Admitted)
	}
	// A counter that went backwards restarts the window and adds nothing.
	c := a
	c.Update(10, 10, t0.Add(3*time.Second), time.Second)
	if c.Offered > a.Offered {
		t.Errorf("a counter going backwards raised the rate: %v → %v", a.Offered, c.Offered)
	}
	// Time standing still changes nothing.
	d := a
	d.Update(1e9, 1e9, t0.Add(2*time.Second), time.Second)
	if d.Offered != a.Offered {
		t.Errorf("dt = 0 changed the rate")
	}
}

func TestHistoryReported(t *testing.T) {
	rep := func(seq uint64) Report { return Report{Seq: seq} }
	me, other := TagOf("n1"), TagOf("n2")
	if me == other {
		t.Fatal("the test's nodes share a tag")
	}
	params := func(refs ...ReportRef) *Params {
		p := &Params{Snapshot: 1000}
		p.Reports = refs
		return p
	}
	var h History
	if _, s := h.Reported(params(), "n1"); s != Absent {
		t.Errorf("never wrote: %v, want Absent", s)
	}
	h.Add(10, rep(1))
	h.Add(20, rep(2))
	h.Add(30, rep(3))
	for _, c := range []struct {
		name string
		p    *Params
		seq  uint64
		want Standing
	}{
		{"its latest report counted", params(ReportRef{20, other}, ReportRef{30, me}), 3, Counted},
		{"an older report of its own counted", params(ReportRef{20, me}, ReportRef{25, other}), 2, Counted},
		{"not listed: its report missing or unreadable", params(ReportRef{25, other}), 0, Absent},
		{"no report counted at all", params(), 0, Absent},
		{"listed at an index it never wrote: a previous process's report", params(ReportRef{5, me}), 0, Unknown},
		{"its index listed under another node's tag", params(ReportRef{30, other}), 0, Absent},
	} {
		r, s := h.Reported(c.p, "n1")
		if s != c.want || r.Seq != c.seq {
			t.Errorf("%s: seq %d %v, want seq %d %v", c.name, r.Seq, s, c.seq, c.want)
		}
	}
	// Once the history has dropped an entry, parameters that counted it
	// are Unknown, not Absent.
	for i := range HistoryLen {
		h.Add(uint64(100+i), rep(uint64(100+i)))
	}
	if _, s := h.Reported(params(ReportRef{30, me}), "n1"); s != Unknown {
		t.Errorf("a report older than the history: %v, want Unknown", s)
	}
	h.Reset()
	if _, s := h.Reported(params(ReportRef{100, me}), "n1"); s != Unknown {
		t.Errorf("after Reset, listed: %v, want Unknown", s)
	}
	if _, s := h.Reported(params(), "n1"); s != Absent {
		t.Errorf("after Reset, not listed: %v, want Absent", s)
	}
}

func TestStretchAndMoved(t *testing.T) {
	for _, c := range []struct {
		n    int
		want time.Duration
	}{{1, time.Second}, {100, time.Second}, {101, 1010 * time.Millisecond}, {1000, 10 * time.Second}} {
		if got := Stretch(time.Second, c.n, 100); got != c.want {
			t.Errorf("Stretch(1s, %d, 100) = %v, want %v", c.n, got, c.want)
		}
	}
	if Stretch(time.Second, 1000, 0) != time.Second {
		t.Error("no cap: the interval")
	}
	if !Moved(100, 120, 0.1, 1) || Moved(100, 105, 0.1, 1) || Moved(0, 0.5, 0.1, 1) || !Moved(0, 2, 0.1, 1) {
		t.Error("Moved")
	}
}

// A warm meter reads its first window as it is; a cold one climbs from 0.
func TestRatesWarm(t *testing.T) {
	start := time.Unix(0, 0)
	for _, tc := range []struct {
		warm bool
		want float64
	}{{true, 100}, {false, 100 * (1 - math.Exp(-0.1/0.25))}} {
		r := Rates{Warm: tc.warm}
		r.Update(0, 0, start, 250*time.Millisecond)
		r.Update(10, 10, start.Add(100*time.Millisecond), 250*time.Millisecond)
		if math.Abs(r.Offered-tc.want) > 1e-9 {
			t.Errorf("warm %v: first window read %v, want %v", tc.warm, r.Offered, tc.want)
		}
		// From then on both average.
		r.Update(10, 10, start.Add(200*time.Millisecond), 250*time.Millisecond)
		if r.Offered >= tc.want {
			t.Errorf("warm %v: an idle window did not lower the rate: %v", tc.warm, r.Offered)
		}
	}
}

// The report the parameters in force counted stays known, once pinned,
// however many reports follow; another division's parameters, or a new
// session (Reset), let it go.
func TestHistoryPinKeepsTheCountedReport(t *testing.T) {
	var h History
	h.Add(5, Report{Seq: 5})
	p := &Params{Reports: []ReportRef{{Index: 5, Node: TagOf("n1")}}}
	h.Pin(p, "n1")
	for i := uint64(6); i < 6+2*HistoryLen; i++ {
		h.Add(i, Report{Seq: i})
	}
	if r, st := h.Reported(p, "n1"); st != Counted || r.Seq != 5 {
		t.Fatalf("pinned report after %d more: %v %+v, want counted, seq 5", 2*HistoryLen, st, r)
	}
	var unpinned History
	unpinned.Add(5, Report{Seq: 5})
	for i := uint64(6); i < 6+2*HistoryLen; i++ {
		unpinned.Add(i, Report{Seq: i})
	}
	if _, st := unpinned.Reported(p, "n1"); st != Unknown {
		t.Fatalf("unpinned report after %d more: %v, want unknown", 2*HistoryLen, st)
	}
	// A later division pins its own report; the old one goes.
	later := &Params{Reports: []ReportRef{{Index: 6 + 2*HistoryLen - 1, Node: TagOf("n1")}}}
	h.Pin(later, "n1")
	for i := uint64(100); i < 100+HistoryLen; i++ {
		h.Add(i, Report{Seq: i})
	}
	if _, st := h.Reported(p, "n1"); st != Unknown {
		t.Fatalf("the first division's report after another was pinned: %v, want unknown", st)
	}
	if _, st := h.Reported(later, "n1"); st != Counted {
		t.Fatalf("the later division's report: %v, want counted", st)
	}
	h.Reset()
	if _, st := h.Reported(later, "n1"); st != Unknown {
		t.Fatalf("after Reset: %v, want unknown", st)
	}
}
