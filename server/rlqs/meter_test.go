package rlqs

import (
	"testing"
	"time"
)

// TestReportedDemandIsMeteredAsAFlow: Envoy reports every 5 s, but demand
// sharing's meters are read every 100 ms with a time constant of a fraction
// of a second; a report counted at once, in one lump, reads as a spike and
// then nothing, and the leader gives the replica a floor. What a report says
// is counted as a flow at its rate, tick by tick, until the next report.
func TestReportedDemandIsMeteredAsAFlow(t *testing.T) {
	f := newFixture(t, nil)
	id := map[string]string{"k": "v"}
	f.eng.limit("d", "k=v", 1, 100, 100, 1)
	st, _ := f.stream()
	f.exchange(st, report("d", usage(id, 1, 0, 0)))
	f.clock.advance(5 * time.Second)
	f.exchange(st, report("d", usage(id, 300, 200, 5*time.Second))) // 100/s offered, 60/s admitted
	if got := f.eng.reportedTotal(); got > 2 {
		t.Fatalf("%d requests counted when the report arrived; want them spread over the next ticks", got)
	}
	f.svc.Tick() // the divider ticks on: the flow starts here
	var per []uint64
	for range 20 { // two seconds of ticks
		before := f.eng.reportedTotal()
		f.clock.advance(100 * time.Millisecond)
		f.svc.Tick()
		per = append(per, f.eng.reportedTotal()-before)
	}
	for i, n := range per {
		if n < 9 || n > 11 {
			t.Fatalf("tick %d counted %d requests, want about 10 (100/s over 100 ms); all: %v", i, n, per)
		}
	}
	if off, adm := f.eng.reportedTotals(); adm*10 < off*5 || adm*10 > off*7 {
		t.Errorf("admitted %d of %d offered, want about 60%%", adm, off)
	}
	// A stream that ends: TestEndedStreamKeepsItsDemandMeteredUntilTTL.
}
