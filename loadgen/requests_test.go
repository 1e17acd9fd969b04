package loadgen

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// checkDescriptors fails unless every descriptor of req has the entries shape
// calls for, all keys and values non-empty, and returns each descriptor as a
// "key=value,..." string.
func checkDescriptors(t *testing.T, shape Shape, req *rlsv3.RateLimitRequest) []string {
	t.Helper()
	var out []string
	for _, d := range req.GetDescriptors() {
		entries := d.GetEntries()
		wantKeys := map[Shape][]string{
			ShapeGenericKey:    {"generic_key"},
			ShapeRemoteAddress: {"remote_address"},
			ShapeNested:        {"path", "remote_address"},
		}[shape]
		if len(entries) != len(wantKeys) {
			t.Fatalf("%s: descriptor has %d entries, want %d", shape, len(entries), len(wantKeys))
		}
		var parts []string
		for i, e := range entries {
			if e.GetKey() != wantKeys[i] || e.GetValue() == "" {
				t.Fatalf("%s: entry %d is %q=%q, want key %q and a value", shape, i, e.GetKey(), e.GetValue(), wantKeys[i])
			}
			if e.GetKey() == "remote_address" {
				if a, err := netip.ParseAddr(e.GetValue()); err != nil || !a.Is4() {
					t.Fatalf("%s: remote_address %q is not an IPv4 address", shape, e.GetValue())
				}
			}
			if e.GetKey() == "path" && e.GetValue() != NestedPath {
				t.Fatalf("%s: path %q, want %q", shape, e.GetValue(), NestedPath)
			}
			parts = append(parts, e.GetKey()+"="+e.GetValue())
		}
		out = append(out, strings.Join(parts, ","))
	}
	return out
}

func TestRequestsCoverCardinality(t *testing.T) {
	t.Parallel()
	type tc struct {
		shape       Shape
		cardinality int
		descriptors int
	}
	var tests []tc
	for _, shape := range Shapes() {
		if shape == ShapeMix {
			continue // its own layout; TestMixShape
		}
		for _, n := range []int{1, 7, 1000, 12345} {
			for _, d := range []int{1, 3, 10} {
				tests = append(tests, tc{shape, n, d})
			}
		}
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%s/n=%d/d=%d", tc.shape, tc.cardinality, tc.descriptors), func(t *testing.T) {
			t.Parallel()
			b := newRequestBuilder(newKeySpace(tc.shape, tc.cardinality), "bench", tc.descriptors, 3)
			// Enough requests to walk the key space twice.
			n := 2 * ((tc.cardinality + tc.descriptors - 1) / tc.descriptors)
			seen := make(map[string]int)
			for s := range uint64(n) {
				req := b.build(s)
				if req.GetDomain() != "bench" || req.GetHitsAddend() != 3 || len(req.GetDescriptors()) != tc.descriptors {
					t.Fatalf("request %d: domain %q, hits_addend %d, %d descriptors", s, req.GetDomain(), req.GetHitsAddend(), len(req.GetDescriptors()))
				}
				ds := checkDescriptors(t, tc.shape, req)
				if tc.cardinality >= tc.descriptors {
					inReq := make(map[string]bool)
					for _, d := range ds {
						if inReq[d] {
							t.Fatalf("request %d repeats descriptor %s although cardinality >= descriptors", s, d)
						}
						inReq[d] = true
					}
				}
				for _, d := range ds {
					seen[d]++
				}
			}
			if len(seen) != tc.cardinality {
				t.Fatalf("%d distinct descriptors, want %d", len(seen), tc.cardinality)
			}
		})
	}
}

func TestLargeKeySpaceFormatsOnTheFly(t *testing.T) {
	t.Parallel()
	for _, shape := range Shapes() {
		if shape == ShapeMix {
			continue // its own layout; TestMixShape
		}
		t.Run(string(shape), func(t *testing.T) {
			t.Parallel()
			ks := newKeySpace(shape, MaxCardinality)
			if ks.table != nil {
				t.Fatalf("a %d-key space was tabulated; the limit is %d", MaxCardinality, tableMax)
			}
			b := newRequestBuilder(ks, "bench", 1, 0)
			seen := make(map[string]bool)
			const n = 20000
			for s := range uint64(n) {
				// Spread the sample over the whole space.
				for _, d := range checkDescriptors(t, shape, b.build(s*(MaxCardinality/n))) {
					seen[d] = true
				}
			}
			if len(seen) != n {
				t.Fatalf("%d distinct descriptors in %d requests", len(seen), n)
			}
		})
	}
}

// inverseMod24 returns the inverse of odd a modulo 2^24, by Newton's iteration.
func inverseMod24(a uint32) uint32 {
	x := a // correct to 3 bits for odd a
	for range 4 {
		x *= 2 - a*x
	}
	return x & (1<<24 - 1)
}

// TestScramble24IsAPermutation inverts each step, which proves that distinct key
// indexes below 2^24 get distinct addresses.
func TestScramble24IsAPermutation(t *testing.T) {
	t.Parallel()
	const mask = 1<<24 - 1
	unscramble := func(y uint32) uint32 {
		x := (y * inverseMod24(0x2545F5)) & mask
		x ^= x >> 12 // a 12-bit xorshift of 24 bits is its own inverse
		return (x * inverseMod24(0x9E3779)) & mask
	}
	for k := uint32(0); k < 1<<24; k += 13 {
		if x := scramble24(k); x > mask || unscramble(x) != k {
			t.Fatalf("scramble24(%d) = %d, which does not invert", k, x)
		}
	}
	for _, k := range []uint32{1, 2, mask - 1, mask} {
		if unscramble(scramble24(k)) != k {
			t.Fatalf("scramble24(%d) does not invert", k)
		}
	}
}

func TestParseShape(t *testing.T) {
	t.Parallel()
	for _, s := range Shapes() {
		if got, err := ParseShape(string(s)); err != nil || got != s {
			t.Errorf("ParseShape(%q) = %q, %v", s, got, err)
		}
	}
	if _, err := ParseShape("header"); err == nil || !strings.Contains(err.Error(), "generic_key") {
		t.Errorf("ParseShape(header): %v, want an error listing the shapes", err)
	}
}

func BenchmarkBuild(b *testing.B) {
	for _, tc := range []struct {
		shape Shape
		n     int
	}{
		{ShapeRemoteAddress, 1000},
		{ShapeNested, 1 << 20},
		{ShapeRemoteAddress, MaxCardinality}, // formatted per request
	} {
		b.Run(fmt.Sprintf("%s/%d", tc.shape, tc.n), func(b *testing.B) {
			bld := newRequestBuilder(newKeySpace(tc.shape, tc.n), "bench", 10, 0)
			b.ReportAllocs()
			b.ResetTimer()
			var req *rlsv3.RateLimitRequest
			for i := range b.N {
				req = bld.build(uint64(i))
			}
			b.StopTimer()
			if v := req.GetDescriptors()[9].GetEntries()[0].GetValue(); v == "" {
				b.Fatal("benchmark built empty values")
			}
		})
	}
}

// TestMixShape: three descriptors on nine requests in ten and four on the
// tenth, the wildcard path spread over MixPaths values and the address over the
// cardinality.
func TestMixShape(t *testing.T) {
	b := newRequestBuilder(newKeySpace(ShapeMix, 1000), "bench-mix", 1, 0)
	paths, addrs := map[string]bool{}, map[string]bool{}
	four := 0
	const n = 20_000
	for seq := range uint64(n) {
		req := b.build(seq)
		switch len(req.Descriptors) {
		case 4:
			four++
			if e := req.Descriptors[3].Entries[0]; e.Key != "header_match" || e.Value != "abuse" {
				t.Fatalf("fourth descriptor %v", e)
			}
		case 3:
		default:
			t.Fatalf("request %d has %d descriptors", seq, len(req.Descriptors))
		}
		if e := req.Descriptors[0].Entries[0]; e.Key != "generic_key" || e.Value != "api" {
			t.Fatalf("first descriptor %v", e)
		}
		p := req.Descriptors[1].Entries[0]
		if p.Key != "path" || !strings.HasPrefix(p.Value, "/api/v1/items/") {
			t.Fatalf("path descriptor %v", p)
		}
		paths[p.Value] = true
		addrs[req.Descriptors[2].Entries[0].Value] = true
	}
	if four != n/MixOverEvery {
		t.Errorf("%d of %d requests carry the binding descriptor, want %d", four, n, n/MixOverEvery)
	}
	if len(paths) != MixPaths || len(addrs) != 1000 {
		t.Errorf("%d paths (want %d), %d addresses (want 1000)", len(paths), MixPaths, len(addrs))
	}
}
