package server

import (
	"strings"
	"testing"
	"time"
)

// A share that moves by demand moves a little at every division. Each tiny
// move draws a "share changed" line whose title names the same share twice.
func TestSparkShareMarkForInvisibleChange(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	h := &History{StepSeconds: 10, Partial: 5}
	rh := &RuleHistory{Rule: "d.k", Unit: "second"}
	for i := range historySlots + 1 {
		h.Starts = append(h.Starts, t0.Add(time.Duration(i)*HistoryStep))
		rh.Admitted = append(rh.Admitted, 100)
		rh.Over = append(rh.Over, 0)
		rh.Shadow = append(rh.Shadow, 0)
		rh.Share = append(rh.Share, 0.25+float64(i%2)*1e-6) // demand noise
	}
	s := newSpark(h, rh)
	same := 0
	for _, m := range s.Marks {
		if m.Kind == MarkShare {
			parts := strings.Split(strings.TrimPrefix(m.Title, "share "), " → ")
			if len(parts) == 2 && parts[0] == parts[1] {
				same++
			}
		}
	}
	if same > 0 {
		t.Errorf("%d of the sparkline's %d marks say a share changed to itself (e.g. %q): a line in every slot",
			same, len(s.Marks), s.Marks[0].Title)
	}
}
