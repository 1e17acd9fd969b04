package daemon

import (
	"fmt"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/server"
)

// newEngine is engine.New, failing t on an error.
func newEngine(t testing.TB, set *descriptors.Set, store *bucket.Store, opts engine.Options) *engine.Engine {
	t.Helper()
	e, err := engine.New(set, store, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// The installer puts the first set in force as at start-up (its rules start
// full) and every later one as a reload at the clock's reading: a lowered
// limit keeps the fill ratio, and a renamed rule ramps.
func TestInstallerReloadsKeepTheCap(t *testing.T) {
	store := bucket.NewStore(0)
	e := newEngine(t, nil, store, engine.Options{})
	now := int64(0)
	in := newInstaller(e, server.NewMetrics(store), "test", quietLog(), func() int64 { return now })
	install := func(yaml string) {
		t.Helper()
		set, err := descriptors.Compile(descriptors.File{Name: "r.yaml", Data: []byte(yaml)})
		if err != nil {
			t.Fatal(err)
		}
		if err := in.install(set); err != nil {
			t.Fatal(err)
		}
	}
	admitted := func(key string, n int) int {
		t.Helper()
		ok := 0
		for range n {
			var dec engine.Decision
			descs := []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: "x"}}}}
			if err := e.Decide(&dec, "d", descs, 1, now); err != nil {
				t.Fatal(err)
			}
			if dec.Code == engine.OK {
				ok++
			}
		}
		return ok
	}
	rule := func(key string, rpu int) string {
		return fmt.Sprintf("domain: d\ndescriptors:\n  - key: %s\n    rate_limit: {unit: second, requests_per_unit: %d}\n", key, rpu)
	}
	install(rule("a", 300))
	if got := admitted("a", 400); got != 300 {
		t.Fatalf("first set admitted %d, want a full bucket of 300", got)
	}
	now += int64(100 * time.Millisecond)
	install(rule("a", 200)) // 0.1 of the bucket refilled, kept: 20 of 200
	if got := admitted("a", 400); got != 20 {
		t.Fatalf("after lowering the limit admitted %d, want 20", got)
	}
	install(rule("b", 200))
	if got := admitted("b", 400); got != 0 {
		t.Fatalf("renamed rule admitted %d at once, want 0", got)
	}
	if r := e.Ramping(now); len(r) != 1 || r[0].Path() != "d.b" {
		t.Fatalf("ramping %v, want d.b", r)
	}
	now += int64(500 * time.Millisecond)
	if got := admitted("b", 400); got != 100 {
		t.Fatalf("half its ramp on the renamed rule admitted %d, want 100", got)
	}
}
