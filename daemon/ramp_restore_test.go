package daemon

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/state"
)

// A replica back among 3 after 5 minutes down (within --state-max-age, far
// past every burst time) has nothing left to restore: every saved bucket
// refilled meanwhile. It joins as a newcomer does, with the join ramp; the
// state file must not turn the ramp off.
func TestStaleSnapshotStillRamps(t *testing.T) {
	rampWith := func(stateFile bool) *bucket.Ramp {
		cfg := testConfig(t)
		cfg.Replicas = 3
		if stateFile {
			cfg.StateFile = filepath.Join(t.TempDir(), "state")
			h := state.Header{Written: time.Now().Add(-5 * time.Minute), Seed: 0x1234, Weights: []float64{1, 1.0 / 3}}
			if _, _, err := state.WriteFile(cfg.StateFile, h, func(add func([]bucket.Saved) error) error {
				return add([]bucket.Saved{{Key: 1, Fill: 0, Group: 1, Tag: 7, Rate: 1, Size: 1}})
			}); err != nil {
				t.Fatal(err)
			}
		}
		r := start(t, cfg)
		return r.d.engine.Store().Ramp(r.d.clock())
	}
	if rampWith(false) == nil {
		t.Fatal("control: no ramp without a state file")
	}
	if rampWith(true) == nil {
		t.Fatal("with a 5-minute-old state file from which nothing was restored, the join ramp is off: new buckets start full")
	}
}
