package daemon

import (
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/membership"
)

func TestJoinRamp(t *testing.T) {
	view3 := membership.View{Total: 3, Local: 1, TotalWeight: 3, LocalWeight: 1, Weight: 1.0 / 3}
	confirmed := func(total, local int) membership.View {
		w, _ := membership.Weight(local, total)
		return membership.View{Total: total, Local: local, TotalWeight: total, LocalWeight: local, Weight: w, ObservedAt: time.Unix(1, 0)}
	}
	type step struct {
		at   int64 // seconds
		view membership.View
	}
	for _, tc := range []struct {
		name     string
		consul   bool
		restored bool
		ramp     time.Duration
		initial  membership.View
		steps    []step
		start    int64 // the ramp's start, seconds; -1: no ramp at the end
	}{
		{name: "static, three replicas: from the start", initial: view3, ramp: config.JoinRampAuto, start: 0},
		{name: "static, alone", initial: confirmed(1, 1), ramp: config.JoinRampAuto, start: -1},
		{name: "restored", initial: view3, restored: true, ramp: config.JoinRampAuto, start: -1},
		{name: "off", initial: view3, ramp: 0, start: -1},
		{name: "consul confirms the guess", consul: true, initial: view3, ramp: config.JoinRampAuto,
			steps: []step{{1, confirmed(3, 1)}, {2, confirmed(4, 1)}}, start: 0},
		{name: "consul: not counted yet, joins later", consul: true, initial: view3, ramp: config.JoinRampAuto,
			steps: []step{{1, confirmed(2, 0)}, {5, confirmed(4, 1)}}, start: 5},
		{name: "consul: alone, then others join", consul: true, initial: view3, ramp: config.JoinRampAuto,
			steps: []step{{1, confirmed(1, 1)}, {5, confirmed(2, 1)}}, start: -1},
		{name: "consul: guessed alone, joined", consul: true, initial: confirmed(1, 1), ramp: 3 * time.Second,
			steps: []step{{2, confirmed(3, 1)}}, start: 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var now int64
			store := bucket.NewStore(0)
			v := &view{}
			if tc.consul {
				v.consul = &membership.Consul{}
			}
			in := tc.initial
			if tc.consul {
				in.ObservedAt = time.Time{} // the guess
			}
			v.cur.Store(&in)
			j := newJoiner(store, func() int64 { return now }, tc.ramp, views{v}, tc.restored)
			for _, s := range tc.steps {
				now = s.at * 1e9
				v.cur.Store(&s.view)
				j.observed(v, s.view)
			}
			r := store.Ramp(now)
			switch {
			case tc.start < 0 && r != nil:
				t.Fatalf("a ramp from %v", r.Start)
			case tc.start >= 0 && (r == nil || r.Start != tc.start*1e9):
				t.Fatalf("ramp %+v, want one from %ds", r, tc.start)
			}
			if r != nil && tc.ramp > 0 && r.Fixed != tc.ramp {
				t.Fatalf("fixed %v, want %v", r.Fixed, tc.ramp)
			}
		})
	}
}
