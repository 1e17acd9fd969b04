package engine

import (
	"runtime"
	"strconv"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// TestDomainsNeverShareBuckets: domain "a.b" with key "c" and domain "a" with
// key "b.c" have the same dotted path; their buckets must still be their own.
func TestDomainsNeverShareBuckets(t *testing.T) {
	set, err := descriptors.Compile(
		descriptors.File{Name: "a.yaml", Data: []byte("domain: a.b\ndescriptors:\n  - key: c\n    rate_limit: {unit: hour, requests_per_unit: 3}\n")},
		descriptors.File{Name: "b.yaml", Data: []byte("domain: a\ndescriptors:\n  - key: b.c\n    rate_limit: {unit: hour, requests_per_unit: 3}\n")})
	if err != nil {
		t.Fatal(err)
	}
	e := newEngine(t, set, bucket.NewStore(0), Options{})
	for range 3 {
		decide(e, "a", []*commonv3.RateLimitDescriptor{desc("b.c=x")}, 1, 0, nil)
	}
	if _, code, _ := decide(e, "a.b", []*commonv3.RateLimitDescriptor{desc("c=x")}, 1, 0, nil); code != OK {
		t.Error("domain a.b refused on its first request: it shares domain a's bucket")
	}
}

// TestKeyFlood sends millions of distinct per-IP keys through the engine with a
// small --max-buckets: live buckets never pass the cap, the overflow is counted,
// flooded keys together get no more than the rule's own limit (tighter, never
// looser), the heap stays bounded, and keys that existed before are unaffected.
func TestKeyFlood(t *testing.T) {
	const maxBuckets = 100_000
	const flood = 5_000_000
	set := mustParse(t, `
domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 10}
`)
	e := newEngine(t, set, bucket.NewStore(maxBuckets), Options{Weight: 0.5})
	admit := func(ip string) bool {
		_, code, err := decide(e, "d", []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: ip}}}}, 1, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		return code == OK
	}
	// A normal client, seen before the flood, has drawn 2 of its 5 local tokens.
	admit("192.0.2.1")
	admit("192.0.2.1")

	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	d := &commonv3.RateLimitDescriptor{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address"}}}
	descs := []*commonv3.RateLimitDescriptor{d}
	out := make([]Status, 0, 1)
	buf := make([]byte, 0, 16)
	admittedOverflow := 0
	for i := 0; i < flood; i++ {
		buf = strconv.AppendUint(append(buf[:0], "10."...), uint64(i), 10)
		d.Entries[0].Value = string(buf)
		var code = OK
		var err error
		out, code, err = decide(e, "d", descs, 1, 0, out)
		if err != nil {
			t.Fatal(err)
		}
		if out[0].Overflow && code == OK {
			admittedOverflow++
		}
		if i%100_000 == 0 && e.Store().Live() > maxBuckets {
			t.Fatalf("%d live buckets past the cap of %d", e.Store().Live(), maxBuckets)
		}
	}
	st := e.Store()
	if st.Live() > maxBuckets {
		t.Fatalf("%d live buckets", st.Live())
	}
	// 1% of the cap is kept for overflow buckets; the normal client holds one
	// of the other places.
	if want := uint64(flood - (maxBuckets - maxBuckets/100 - 1)); st.Overflowed() != want {
		t.Fatalf("overflow counted %d, want %d", st.Overflowed(), want)
	}
	// Every overflowed key shares one bucket of the rule: at weight 1/2 that is
	// 5 tokens for all of them together, however many keys.
	if admittedOverflow > 5 {
		t.Fatalf("flooded keys admitted %d through the overflow bucket, more than the rule's share", admittedOverflow)
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if grown > 64<<20 {
		t.Fatalf("heap grew %d MiB for a cap of %d buckets", grown>>20, maxBuckets)
	}
	t.Logf("%d keys: %d live buckets, %d overflowed, %d admitted via overflow, heap +%.1f MiB", flood, st.Live(), st.Overflowed(), admittedOverflow, float64(grown)/(1<<20))
	// The normal client still has its own bucket: 3 more, then over.
	for i := 0; i < 3; i++ {
		if !admit("192.0.2.1") {
			t.Fatalf("normal key refused at draw %d", i+3)
		}
	}
	if admit("192.0.2.1") {
		t.Fatal("normal key got more than its share")
	}
}
