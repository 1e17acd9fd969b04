package engine

import (
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

const snapYAML = "domain: d\ndescriptors:\n" +
	"  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 10}\n" +
	"  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 6}\n"

func snapEngine(t *testing.T, yaml string) *Engine { return seededEngine(t, yaml, 0) }

// seededEngine is snapEngine keying with seed (0 for a fresh one), as a
// restart that restores a snapshot does.
func seededEngine(t *testing.T, yaml string, seed uint64) *Engine {
	t.Helper()
	return newEngine(t, mustParse(t, yaml), bucket.NewStore(0), Options{Seed: seed})
}

func export(e *Engine, now int64) []bucket.Saved {
	var out []bucket.Saved
	e.Export(now, func(b []bucket.Saved) { out = append(out, b...) })
	return out
}

func noOverrides(uint16) (uint16, bool) { return 0, false }

func count(t *testing.T, e *Engine, kv string, n int, now int64) int {
	t.Helper()
	return admitted(t, e, "d", desc(kv), n, now)
}

// A drained key stays drained across a save and a restore into an engine
// with the saved seed; the time the daemon was down refills it at its old
// rate; a bucket refilled by then is not restored.
func TestSnapshotRestoreRefillsDowntime(t *testing.T) {
	a := snapEngine(t, snapYAML)
	if got := count(t, a, "ip=1.2.3.4", 20, 0); got != 10 {
		t.Fatalf("admitted %d of a burst of 10", got)
	}
	count(t, a, "user=u", 6, 0) // refills in a minute
	saved := export(a, 0)
	if len(saved) != 2 {
		t.Fatalf("%d buckets saved", len(saved))
	}
	for _, tc := range []struct {
		down    time.Duration
		ip, usr int // admitted at once after the restore
		kept    int
	}{
		{0, 0, 0, 2},
		{300 * time.Millisecond, 3, 0, 2}, // 10/s for 0.3 s; 0.1/s for 0.3 s
		{20 * time.Second, 10, 2, 1},      // ip refilled (not restored), user 2 of 6
	} {
		b := seededEngine(t, snapYAML, a.Seed())
		if b.Seed() != a.Seed() {
			t.Fatal("seed refused")
		}
		res := b.Restore(saved, a.Weights(), tc.down, noOverrides, 0)
		if res.Kept != tc.kept || res.Kept+res.Full != 2 {
			t.Errorf("down %v: %+v, want %d kept", tc.down, res, tc.kept)
		}
		if got := count(t, b, "ip=1.2.3.4", 20, 0); got != tc.ip {
			t.Errorf("down %v: ip admitted %d, want %d", tc.down, got, tc.ip)
		}
		if got := count(t, b, "user=u", 20, 0); got != tc.usr {
			t.Errorf("down %v: user admitted %d, want %d", tc.down, got, tc.usr)
		}
	}
}

// A bucket whose rule is gone is dropped; one whose rule's limit changed is
// kept at its fill ratio (TestRestoreUnderChangedLimit has the figures).
func TestSnapshotDropsGoneRules(t *testing.T) {
	a := snapEngine(t, snapYAML)
	count(t, a, "ip=1.2.3.4", 10, 0)
	count(t, a, "user=u", 6, 0)
	saved := export(a, 0)
	b := seededEngine(t, "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 20}\n", a.Seed())
	res := b.Restore(saved, a.Weights(), 0, noOverrides, 0)
	if res.Kept != 1 || res.Gone != 1 {
		t.Fatalf("%+v, want ip's kept (its limit changed) and user's gone", res)
	}
	if b.Store().Live() != 1 {
		t.Fatalf("%d live", b.Store().Live())
	}
	if got := count(t, b, "ip=1.2.3.4", 20, 0); got != 0 {
		t.Fatalf("ip's drained bucket admitted %d under its new limit", got)
	}
}

// Without the saved seed the keys mean nothing: the restored bucket is
// never found again. This is why a snapshot whose seed cannot be used is
// not restored at all.
func TestSnapshotNeedsTheSeed(t *testing.T) {
	a := snapEngine(t, snapYAML)
	count(t, a, "ip=1.2.3.4", 10, 0)
	saved := export(a, 0)
	b := snapEngine(t, snapYAML)
	b.Restore(saved, a.Weights(), 0, noOverrides, 0)
	if got := count(t, b, "ip=1.2.3.4", 20, 0); got != 10 {
		t.Fatalf("under another seed the key admitted %d, want a fresh 10", got)
	}
	if b.Seed() == 0 || b.Seed() == a.Seed() {
		t.Fatalf("an engine given no seed keys with %x (the other's is %x)", b.Seed(), a.Seed())
	}
}

// A weight that changed between save and restore: the fill ratio carries
// over, as a re-division does; the downtime refills at the old weight.
func TestSnapshotAcrossWeights(t *testing.T) {
	a := newEngine(t, mustParse(t, snapYAML), bucket.NewStore(0), Options{Weight: 0.5})
	count(t, a, "ip=1.2.3.4", 10, 0) // 5 of 5
	saved := export(a, 0)
	b := newEngine(t, mustParse(t, snapYAML), bucket.NewStore(0), Options{Weight: 0.25, Seed: a.Seed()})
	// Down 0.2 s at 5/s: 1 token of 5, fill 0.2; at 0.25 (2.5 tokens) that is 0.5.
	b.Restore(saved, a.Weights(), 200*time.Millisecond, noOverrides, 0)
	if got := count(t, b, "ip=1.2.3.4", 10, 0); got != 0 {
		t.Fatalf("admitted %d with half a token", got)
	}
	if got := count(t, b, "ip=1.2.3.4", 10, int64(200*time.Millisecond)); got != 1 {
		t.Fatalf("0.2 s later at 2.5/s: admitted %d, want 1", got)
	}
}

// A hot value's debt is saved under its usual key: the restarted daemon,
// which has no hot values, finds it there.
func TestSnapshotSavesHotDebt(t *testing.T) {
	e, d := hotRig(t)
	hot := e.SetHot(d, []uint64{idOf(e, d, "client=c1")}, 0)
	e.SetGroupWeight(hot[0].Group(), 0.8, 0)
	if got := admitted(t, e, "a", desc("client=c1"), 100, 0); got != 80 {
		t.Fatalf("hot admitted %d", got)
	}
	saved := export(e, 0)
	if len(saved) != 1 || saved[0].Group != uint16(d.DomainGroup()) || saved[0].Fill > 1e-9 {
		t.Fatalf("saved %+v, want one empty bucket in the domain's group", saved)
	}
	b, _ := hotRigWith(t, Options{Weight: 0.25, Seed: e.Seed()})
	if res := b.Restore(saved, e.Weights(), 0, noOverrides, 0); res.Kept != 1 {
		t.Fatalf("%+v", res)
	}
	if got := admitted(t, b, "a", desc("client=c1"), 10, 0); got != 0 {
		t.Fatalf("after the restart c1 admitted %d, its bucket spent", got)
	}
}

// A request's own limit (no rule) is restored into the group its saved
// group maps to.
func TestSnapshotOverrides(t *testing.T) {
	a := snapEngine(t, snapYAML)
	ov := &commonv3.RateLimitDescriptor{Entries: entries("ip=9.9.9.9"), Limit: &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 3, Unit: 1}}
	admitted(t, a, "d", ov, 3, 0)
	saved := export(a, 0)
	b := seededEngine(t, snapYAML, a.Seed())
	if res := b.Restore(saved, a.Weights(), 0, func(g uint16) (uint16, bool) { return g, true }, 0); res.Kept != 1 {
		t.Fatalf("%+v", res)
	}
	if got := admitted(t, b, "d", ov, 3, 0); got != 0 {
		t.Fatalf("override admitted %d after restore", got)
	}
}
