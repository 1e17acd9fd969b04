package descriptors

import (
	"math"
	"math/bits"
	"math/rand/v2"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

func TestParseInvalid(t *testing.T) {
	files, _ := filepath.Glob("testdata/invalid/*.yaml")
	if len(files) < 20 {
		t.Fatalf("only %d invalid fixtures found", len(files))
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			set, err := compileFiles(t, f)
			if err == nil {
				t.Fatalf("loaded without error:\n%s", set.Dump())
			}
			errs := Errors(err)
			if len(errs) == 0 {
				t.Fatalf("error carries no position: %v", err)
			}
			for _, e := range errs {
				if e.Pos.File != f || e.Pos.Line < 1 || e.Pos.Col < 1 {
					t.Errorf("bad position %v in %q", e.Pos, e)
				}
			}
			testutil.Golden(t, strings.TrimSuffix(f, ".yaml")+".err", err.Error()+"\n")
		})
	}
}

func TestParseValid(t *testing.T) {
	files, _ := filepath.Glob("testdata/valid/*.yaml")
	if len(files) < 3 {
		t.Fatalf("only %d valid fixtures found", len(files))
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			set, err := compileFiles(t, f)
			if err != nil {
				t.Fatal(err)
			}
			testutil.Golden(t, strings.TrimSuffix(f, ".yaml")+".golden", set.Dump())
		})
	}
}

func TestDuplicateDomainAcrossFiles(t *testing.T) {
	_, err := compileFiles(t, "testdata/dupdomain")
	if err == nil {
		t.Fatal("duplicate domain accepted")
	}
	testutil.Golden(t, "testdata/dupdomain.err", err.Error()+"\n")
}

func TestParseNumbersAsStrings(t *testing.T) {
	set, err := Parse("s.yaml", strings.NewReader(`
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: "25", unit_multiplier: "2", burst: "7"}
`))
	if err != nil {
		t.Fatal(err)
	}
	l := set.Rule(0).Limit()
	if l.RequestsPerUnit() != 25 || l.UnitMultiplier() != 2 || l.Burst() != 7 {
		t.Fatalf("got %+v", l)
	}
	if l.Params().Rate != 12.5 || l.Params().Size != 7 {
		t.Fatalf("params %+v", l.Params())
	}
}

func TestUnitsCaseInsensitive(t *testing.T) {
	for _, u := range []string{"second", "MINUTE", "Hour", "day", "week", "month", "year"} {
		set, err := Parse("u.yaml", strings.NewReader("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: "+u+", requests_per_unit: 1}\n"))
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		if got := set.Rule(0).Limit().Unit().String(); got != strings.ToLower(u) {
			t.Errorf("%s parsed as %s", u, got)
		}
	}
	if Month.Duration() != 30*24*60*60*1e9 || Year.Duration() != 365*24*60*60*1e9 {
		t.Error("month is 30 days and year 365, as upstream")
	}
}

func TestDomainKeyAfterDescriptors(t *testing.T) {
	set, err := Parse("late.yaml", strings.NewReader("descriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\ndomain: late\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := set.Rule(0); r.Path() != "late.a" || r.Domain() != "late" {
		t.Fatalf("path %q domain %q", r.Path(), r.Domain())
	}
}

func TestWindowOK(t *testing.T) {
	t.Parallel()
	tests := []struct {
		unit Unit
		mult uint32
		want bool
	}{
		{Second, 0, true}, // 0 counts as 1
		{Second, 1, true},
		{Second, 315_360_000, true},
		{Second, 315_360_001, false},
		{Second, math.MaxUint32, false},
		{Minute, 5_256_000, true},
		{Minute, 5_256_001, false},
		{Minute, math.MaxUint32, false}, // the product would overflow
		{Hour, 87_600, true},
		{Hour, 87_601, false},
		{Day, 3650, true},
		{Day, 3651, false},
		{Day, 200_000, false}, // the product would overflow
		{Week, 521, true},     // 3647 days
		{Week, 522, false},    // 3654 days
		{Month, 121, true},    // 3630 days
		{Month, 122, false},   // 3660 days
		{Year, 10, true},
		{Year, 11, false},
		{Year, math.MaxUint32, false},
		{UnitUnknown, 1, false},
		{Unit(99), 1, false},
	}
	for _, tc := range tests {
		if got := WindowOK(tc.unit, tc.mult); got != tc.want {
			t.Errorf("WindowOK(%s, %d) = %v, want %v", tc.unit, tc.mult, got, tc.want)
		}
	}
}

// TestLimitWindowNeverWraps builds limits by hand, past anything Parse
// accepts: a window that wrapped negative made the rate negative, and a
// negative rate blocks everything. It also checks WindowOK against the
// product computed without overflow.
func TestLimitWindowNeverWraps(t *testing.T) {
	t.Parallel()
	units := []Unit{Second, Minute, Hour, Day, Week, Month, Year}
	rng := rand.New(rand.NewPCG(3, 4))
	for range 10_000 {
		u := units[rng.IntN(len(units))]
		mult := rng.Uint32()
		if rng.IntN(2) == 0 {
			mult = uint32(rng.IntN(5000))
		}
		hi, lo := bits.Mul64(uint64(u.Duration()), uint64(max(mult, 1)))
		fits := hi == 0 && lo <= uint64(MaxWindow)
		if got := WindowOK(u, mult); got != fits {
			t.Fatalf("WindowOK(%s, %d) = %v, want %v", u, mult, got, fits)
		}
		l := &Limit{unit: u, unitMultiplier: mult}
		w := l.Window()
		if w <= 0 || w > MaxWindow {
			t.Fatalf("%d × %s: window %s, want within (0, %s]", mult, u, w, MaxWindow)
		}
		if fits && uint64(w) != lo {
			t.Fatalf("%d × %s: window %s, want %s", mult, u, w, time.Duration(lo))
		}
	}
	if w := (&Limit{unitMultiplier: 3}).Window(); w != 0 {
		t.Fatalf("window of an unknown unit = %s, want 0", w)
	}
}

// TestAccessorsCannotChangeTheRules: what a Rule, Limit or Set hands out is
// the caller's own; changing it changes nothing in the set.
func TestAccessorsCannotChangeTheRules(t *testing.T) {
	set, err := Parse("m.yaml", strings.NewReader(`
domain: d
descriptors:
  - key: k
    metadata: {owner: {team: a}, tags: [x]}
    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: other}]}
`))
	if err != nil {
		t.Fatal(err)
	}
	r := set.Rule(0)
	r.Metadata()["owner"].(map[string]any)["team"] = "changed"
	r.Metadata()["tags"].([]any)[0] = "changed"
	r.Metadata()["new"] = 1
	r.Limit().Replaces()[0] = "changed"
	set.Rules()[0] = nil
	set.Files()[0] = "changed"
	if got := r.Metadata(); got["owner"].(map[string]any)["team"] != "a" || got["tags"].([]any)[0] != "x" || len(got) != 2 {
		t.Errorf("metadata changed through a copy: %v", got)
	}
	if r.Limit().Replaces()[0] != "other" || set.Rule(0) != r || set.Files()[0] != "m.yaml" {
		t.Error("a slice handed out was the set's own")
	}
}

// TestMergeDomains: with MergeDomains, files naming one domain are one
// domain, as upstream's MERGE_DOMAIN_CONFIG; a descriptor defined in two of
// them is still refused, naming both places. Without it, the same files are
// refused as a duplicate domain.
func TestMergeDomains(t *testing.T) {
	merge := CompileOptions{MergeDomains: true}
	set, err := compileFilesWith(t, merge, "testdata/mergedomain/ok")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Golden(t, "testdata/mergedomain/ok.golden", set.Dump())
	if r := set.Match("shop", entries("checkout=x")); r == nil || r.Pos().File != "testdata/mergedomain/ok/b.yaml" {
		t.Fatalf("checkout matched %v, want the rule from b.yaml", r)
	}
	// The engine's TestMergedDomainDecides decides with this set.

	_, err = compileFilesWith(t, merge, "testdata/mergedomain/dup")
	if err == nil {
		t.Fatal("a descriptor defined in two merged files was accepted")
	}
	testutil.Golden(t, "testdata/mergedomain/dup.err", err.Error()+"\n")

	if _, err := compileFiles(t, "testdata/mergedomain/ok"); err == nil || !strings.Contains(err.Error(), "duplicate domain 'shop'") {
		t.Fatalf("without merging: %v, want a duplicate domain error", err)
	}
}

// TestMetadataAsJSON: metadata is kept in the types a protobuf Struct holds,
// so response dynamic metadata can always be built from it: numbers are
// float64, keys and odd scalars their text, aliases and merges resolved.
func TestMetadataAsJSON(t *testing.T) {
	set := mustParse(t, `
domain: md
descriptors:
  - key: a
    metadata:
      team: &team payments
      owners: [x, *team]
      nested: {limit: 5, ratio: 0.5, on: true, none: ~, when: 2001-12-14, 7: seven, hex: 0x10}
      shared: &base {a: 1}
      merged: {<<: *base, b: 2}
    rate_limit: {unit: second, requests_per_unit: 1}
`)
	got := set.Rules()[0].Metadata()
	want := map[string]any{
		"team":   "payments",
		"owners": []any{"x", "payments"},
		"nested": map[string]any{"limit": 5.0, "ratio": 0.5, "on": true, "none": nil, "when": "2001-12-14", "7": "seven", "hex": 16.0},
		"shared": map[string]any{"a": 1.0},
		"merged": map[string]any{"a": 1.0, "b": 2.0},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("metadata\n got %#v\nwant %#v", got, want)
	}
}
