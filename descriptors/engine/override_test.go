package engine

import (
	"runtime"
	"strconv"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// TestOverrideFlood: a request's own limit on a route whose entry values the
// client chooses must not open a bucket per value past --max-buckets. A million
// distinct override keys with a cap of 10,000 leave the store at or below the
// cap, the heap within 5 MiB, and ordinary keys still get buckets of their own.
func TestOverrideFlood(t *testing.T) {
	const maxBuckets = 10_000
	const flood = 1_000_000
	set := mustParse(t, `
domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: hour, requests_per_unit: 10}
`)
	e := newEngine(t, set, bucket.NewStore(maxBuckets), Options{})
	ordinary := func(ip string) Code {
		t.Helper()
		_, code, err := decide(e, "d", []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: ip}}}}, 1, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		return code
	}
	// A client seen before the flood has drawn 2 of its 10.
	ordinary("192.0.2.1")
	ordinary("192.0.2.1")
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)

	d := &commonv3.RateLimitDescriptor{
		Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "user"}},
		Limit:   &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_HOUR},
	}
	descs := []*commonv3.RateLimitDescriptor{d}
	out := make([]Status, 0, 1)
	buf := make([]byte, 0, 16)
	admittedOverflow := 0
	for i := range flood {
		buf = strconv.AppendUint(append(buf[:0], "u"...), uint64(i), 10)
		d.Entries[0].Value = string(buf)
		var code Code
		var err error
		out, code, err = decide(e, "d", descs, 1, 0, out)
		if err != nil {
			t.Fatal(err)
		}
		if out[0].Overflow && code == OK {
			admittedOverflow++
		}
		if i%50_000 == 0 && e.Store().Live() > maxBuckets {
			t.Fatalf("after %d keys: %d live buckets past the cap of %d", i, e.Store().Live(), maxBuckets)
		}
	}
	runtime.GC()
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	st := e.Store()
	t.Logf("%d override keys: %d live buckets, %d overflowed, %d admitted via overflow, heap %+.2f MiB", flood, st.Live(), st.Overflowed(), admittedOverflow, float64(grown)/(1<<20))
	if st.Live() > maxBuckets {
		t.Fatalf("%d live buckets past the cap of %d", st.Live(), maxBuckets)
	}
	if grown > 5<<20 {
		t.Fatalf("heap grew %.1f MiB, more than 5 MiB", float64(grown)/(1<<20))
	}
	// Past the cap every override of this domain and limit shares one bucket:
	// 5 tokens for all of them together.
	if admittedOverflow > 5 {
		t.Fatalf("flooded override keys admitted %d through overflow, more than one bucket's 5", admittedOverflow)
	}
	// The client seen before still has its own bucket, with its state: 8 more,
	// then over.
	for i := range 8 {
		if ordinary("192.0.2.1") != OK {
			t.Fatalf("ordinary key refused at draw %d of its 10", i+3)
		}
	}
	if ordinary("192.0.2.1") == OK {
		t.Fatal("ordinary key got more than its 10")
	}
	// An ordinary key seen for the first time after the flood is limited too,
	// in a bucket of its own or its rule's overflow bucket, never unmetered.
	admitted := 0
	for range 20 {
		if ordinary("192.0.2.7") == OK {
			admitted++
		}
	}
	if admitted == 0 || admitted > 10 {
		t.Fatalf("new ordinary key admitted %d of 20 at 10 per hour", admitted)
	}
}

// TestOverridesShareOneOverflowBucketPerLimit: past the cap, overrides share
// one overflow bucket per (domain, limit), whatever their entries.
func TestOverridesShareOneOverflowBucketPerLimit(t *testing.T) {
	e := newEngine(t, mustParse(t, `
domain: d
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 10}
`), bucket.NewStore(100), Options{})
	admitted := map[uint32]int{}
	for i := range 5000 {
		for _, rpu := range []uint32{3, 4} {
			d := &commonv3.RateLimitDescriptor{Entries: entries("user=u" + strconv.Itoa(i)),
				Limit: &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: rpu, Unit: typev3.RateLimitUnit_HOUR}}
			out, code, err := decide(e, "d", []*commonv3.RateLimitDescriptor{d}, 1, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			if out[0].Overflow && code == OK {
				admitted[rpu]++
			}
		}
	}
	if live := e.Store().Live(); live > 100 {
		t.Fatalf("%d live buckets past a cap of 100", live)
	}
	for rpu, n := range admitted {
		if n != int(rpu) {
			t.Errorf("override %d/hour: overflow admitted %d, want one bucket's %d", rpu, n, rpu)
		}
	}
	if len(admitted) != 2 {
		t.Fatalf("overflow admitted %v", admitted)
	}
}

// TestOverrideWindowTooLong: unit × unit_multiplier past ten years would wrap
// the window negative and block everything; it is bad input instead.
func TestOverrideWindowTooLong(t *testing.T) {
	e := newEngine(t, mustParse(t, "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), bucket.NewStore(0), Options{})
	for _, tc := range []struct {
		unit typev3.RateLimitUnit
		mult uint32
		ok   bool
	}{
		{typev3.RateLimitUnit_DAY, 3650, true},
		{typev3.RateLimitUnit_DAY, 3651, false},
		{typev3.RateLimitUnit_DAY, 200_000, false},
		{typev3.RateLimitUnit_YEAR, 4_000_000_000, false},
		{typev3.RateLimitUnit_SECOND, 4_000_000_000, false},
	} {
		d := &commonv3.RateLimitDescriptor{Entries: entries("k=v"), Limit: &commonv3.RateLimitDescriptor_RateLimitOverride{
			RequestsPerUnit: 1000, Unit: tc.unit, UnitMultiplier: wrapperspb.UInt32(tc.mult)}}
		_, _, err := decide(e, "d", []*commonv3.RateLimitDescriptor{d}, 1, 0, nil)
		if tc.ok != (err == nil) || !tc.ok && !strings.Contains(err.Error(), "descriptors[0].limit.unit_multiplier") {
			t.Errorf("%d × %v: %v", tc.mult, tc.unit, err)
		}
	}
}
