package engine

import (
	"fmt"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// collidingValues finds two values v1 != v2 whose rules "k: v" in domain d
// get the same 16-bit snapshot tag.
func collidingValues(t *testing.T) (string, string) {
	id := func(v, share string) string {
		s := mustParse(t, "domain: d\ndescriptors:\n  - key: k\n    value: "+v+"\n    rate_limit: {unit: minute, requests_per_unit: 1, share: "+share+"}\n")
		return s.Rules()[0].Identity()
	}
	rep := map[uint16]string{}
	clu := map[uint16]string{}
	for i := 0; i < 100000; i++ {
		v := fmt.Sprintf("v%d", i)
		tr, tc := tagOf(id(v, "replica")), tagOf(id(v, "cluster"))
		if o, ok := clu[tr]; ok {
			return v, o
		}
		if o, ok := rep[tc]; ok {
			return o, v
		}
		rep[tr], clu[tc] = v, v
	}
	t.Fatal("no collision")
	return "", ""
}

// Two rules whose 16-bit tags collide and whose limits are the same, one
// share: replica (group 0, weight 1) and one shared (the domain's group,
// weight 0.1): a saved bucket of the shared rule is restored into the
// shared rule's group, never into the replica one's, where the sweeper
// would judge it at weight 1, drop it ten times too early and hand the key
// a fresh burst.
func TestSnapshotTagCollision(t *testing.T) {
	v1, v2 := collidingValues(t)
	t.Logf("colliding values %q %q", v1, v2)
	yaml := "domain: d\ndescriptors:\n" +
		"  - key: k\n    value: " + v1 + "\n    rate_limit: {unit: minute, requests_per_unit: 1, share: replica}\n" +
		"  - key: k\n    value: " + v2 + "\n    rate_limit: {unit: minute, requests_per_unit: 1}\n"
	a := newEngine(t, mustParse(t, yaml), bucket.NewStore(0), Options{Weight: 0.1})
	if got := admitted(t, a, "d", desc("k="+v2), 5, 0); got != 1 {
		t.Fatalf("admitted %d, want the 1 token", got)
	}
	saved := export(a, 0)
	for _, s := range saved {
		t.Logf("saved %+v", s)
	}
	b := newEngine(t, mustParse(t, yaml), bucket.NewStore(0), Options{Weight: 0.1, Seed: a.Seed()})
	b.Restore(saved, a.Weights(), 0, noOverrides, 0)
	for _, s := range export(b, 0) {
		t.Logf("restored as %+v", s)
		if s.Group != saved[0].Group {
			t.Errorf("bucket saved in group %d restored into group %d", saved[0].Group, s.Group)
		}
	}
	// At weight 0.1 the local bucket is 1 token (floored) refilling at
	// 0.1/min: empty for 10 minutes. One minute on, after a sweep, it must
	// still refuse.
	now := int64(61 * time.Second)
	b.Sweep(now)
	if got := admitted(t, b, "d", desc("k="+v2), 5, now); got != 0 {
		t.Errorf("after 61s (a tenth of the refill time) the restored key admitted %d, want 0", got)
	}
	// The same without a restart, for comparison.
	a.Sweep(now)
	if got := admitted(t, a, "d", desc("k="+v2), 5, now); got != 0 {
		t.Errorf("control: the original engine admitted %d", got)
	}
}
