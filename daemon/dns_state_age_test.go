package daemon

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/state"
)

// TestDNSSavedViewRestoredPastMaxAge: a state file older than
// --state-max-age (10m) loses its buckets, not its DNS view, when that view
// is no looser than --replicas. It used to lose both: a replica down 11
// minutes and restarted while the name does not resolve enforced
// --replicas (1 with the migration guide's settings: every limit whole
// beside peers at 1/4), the 1.75 L case 8afb279 fixed for a younger file.
// The count is membership, not tokens: its age does not make it looser
// than --replicas. A saved view looser than --replicas still gives way to
// --replicas past the age.
func TestDNSSavedViewRestoredPastMaxAge(t *testing.T) {
	const name = "web.state-age.invalid."
	for _, tc := range []struct {
		age      time.Duration
		replicas int
		want     float64
	}{
		{9 * time.Minute, 1, 0.25},
		{11 * time.Minute, 1, 0.25},
		{11 * time.Minute, 8, 0.125}, // the saved 1/4 is looser than --replicas 8
	} {
		stateFile := filepath.Join(t.TempDir(), "state")
		h := state.Header{Written: time.Now().Add(-tc.age), Seed: 0x9e3779b97f4a7c15, Weights: []float64{1, 0.25},
			Views: []state.View{{Group: 1, Service: "dns:" + name, Total: 4, Local: 1, TotalWeight: 4, LocalWeight: 1, Weight: 0.25}}}
		if _, _, err := state.WriteFile(stateFile, h, func(func([]bucket.Saved) error) error { return nil }); err != nil {
			t.Fatal(err)
		}
		cfg := testConfig(t)
		cfg.PeersDNS, cfg.PeersDNSServer = name, "127.0.0.1:1" // the name does not resolve
		cfg.StateFile, cfg.Replicas = stateFile, tc.replicas
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		d, err := New(cfg, quietLog(), "test")
		if err != nil {
			t.Fatal(err)
		}
		w := d.engine.GroupWeight(d.views[0].group).W
		v := d.views[0].cur.Load()
		t.Logf("state file %s old (--state-max-age %s), --replicas %d: weight %v, view total=%d", tc.age, cfg.StateMaxAge, tc.replicas, w, v.Total)
		if w != tc.want {
			t.Errorf("restarted %s after a save of 4 replicas, --replicas %d, DNS down: weight %v; want %v", tc.age, tc.replicas, w, tc.want)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // stops what New started
		if err := d.Run(ctx, nil); err != nil {
			t.Error(err)
		}
	}
}
