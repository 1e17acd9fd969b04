package xds

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// Short builders for the protos of the tests.
type (
	rlc  = rlsconfv3.RateLimitConfig
	desc = rlsconfv3.RateLimitDescriptor
	pol  = rlsconfv3.RateLimitPolicy
)

const (
	unknownUnit = rlsconfv3.RateLimitUnit_UNKNOWN
	second      = rlsconfv3.RateLimitUnit_SECOND
	minute      = rlsconfv3.RateLimitUnit_MINUTE
	hour        = rlsconfv3.RateLimitUnit_HOUR
	day         = rlsconfv3.RateLimitUnit_DAY
	// Upstream's proto has these; the generated enum of this build does not.
	week  = rlsconfv3.RateLimitUnit(7)
	month = rlsconfv3.RateLimitUnit(5)
	year  = rlsconfv3.RateLimitUnit(6)
)

func limit(u rlsconfv3.RateLimitUnit, rpu uint32) *pol {
	return &pol{Unit: u, RequestsPerUnit: rpu}
}

func replaces(names ...string) []*rlsconfv3.RateLimitReplace {
	out := make([]*rlsconfv3.RateLimitReplace, len(names))
	for i, n := range names {
		out[i] = &rlsconfv3.RateLimitReplace{Name: n}
	}
	return out
}

// newer sets quota_mode and metadata on d as a server built against upstream's
// proto sends them: fields 7 and 8, unknown to this build's generated type.
func newer(d *desc, quota bool, meta map[string]any) *desc {
	var b []byte
	if quota {
		b = protowire.AppendTag(b, protowire.Number(7), protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	if meta != nil {
		s, err := structpb.NewStruct(meta)
		if err != nil {
			panic(err)
		}
		mb, err := proto.Marshal(s)
		if err != nil {
			panic(err)
		}
		b = protowire.AppendTag(b, protowire.Number(8), protowire.BytesType)
		b = protowire.AppendBytes(b, mb)
	}
	return withUnknown(d, b)
}

// withUnknown appends raw fields to m's unknown fields.
func withUnknown[M proto.Message](m M, raw []byte) M {
	r := m.ProtoReflect()
	r.SetUnknown(append(r.GetUnknown(), raw...))
	return m
}

// unknownField is field num, a varint, as a newer proto might add it.
func unknownField(num int) []byte {
	b := protowire.AppendTag(nil, protowire.Number(num), protowire.VarintType)
	return protowire.AppendVarint(b, 1)
}

func nested(depth int) []*desc {
	d := &desc{Key: "k", RateLimit: limit(second, 1)}
	for range depth - 1 {
		d = &desc{Key: "k", Descriptors: []*desc{d}}
	}
	return []*desc{d}
}

func deepMetadata(depth int) map[string]any {
	m := map[string]any{"leaf": "x"}
	for range depth - 1 {
		m = map[string]any{"n": m}
	}
	return m
}

// convertCases are RateLimitConfig resources and what they become. Every case
// has testdata/convert/NAME.yaml (the rendered file, when rendering succeeds)
// and NAME.dump (the compiled set) or NAME.err (the exact error).
var convertCases = []struct {
	name string
	cfg  *rlc
}{
	{"basic", &rlc{Name: "basic", Domain: "messaging", Descriptors: []*desc{
		{Key: "message_type", Value: "marketing", Descriptors: []*desc{
			{Key: "to_number", RateLimit: limit(day, 5)},
		}},
		{Key: "to_number", RateLimit: limit(day, 100), DetailedMetric: true},
		{Key: "remote_address", Value: "10.*", RateLimit: &pol{Unit: minute, RequestsPerUnit: 30, Name: "wide", Replaces: replaces("narrow")}, ShadowMode: true},
		{Key: "remote_address", Value: "10.0.0.1", RateLimit: &pol{Unit: second, RequestsPerUnit: 2, Name: "narrow"}},
	}}},
	{"units", &rlc{Name: "units", Domain: "units", Descriptors: []*desc{
		{Key: "u", Value: "second", RateLimit: limit(second, 1)},
		{Key: "u", Value: "minute", RateLimit: limit(minute, 1)},
		{Key: "u", Value: "hour", RateLimit: limit(hour, 1)},
		{Key: "u", Value: "day", RateLimit: limit(day, 1)},
		{Key: "u", Value: "week", RateLimit: limit(week, 1)},
		{Key: "u", Value: "month", RateLimit: limit(month, 1)},
		{Key: "u", Value: "year", RateLimit: limit(year, 1)},
	}}},
	{"unlimited", &rlc{Name: "unlimited", Domain: "d", Descriptors: []*desc{
		{Key: "a", RateLimit: &pol{Unlimited: true}},
		{Key: "b", RateLimit: &pol{Unlimited: true, RequestsPerUnit: 7}},
		{Key: "c", RateLimit: &pol{Unlimited: true, Unit: rlsconfv3.RateLimitUnit(42)}},
	}}},
	{"block", &rlc{Name: "block", Domain: "d", Descriptors: []*desc{
		{Key: "blocked", RateLimit: limit(second, 0)},
	}}},
	{"no_descriptors", &rlc{Name: "no_descriptors", Domain: "quiet"}},
	{"unnamed", &rlc{Domain: "d", Descriptors: []*desc{{Key: "k", RateLimit: limit(hour, 3)}}}},
	{"quota_metadata", &rlc{Name: "quota_metadata", Domain: "d", Descriptors: []*desc{
		newer(&desc{Key: "plan", Value: "free", RateLimit: limit(minute, 10)}, true, map[string]any{
			"tier": "free", "weight": 1.5, "count": 3, "big": 1e21, "neg": -2, "on": true, "none": nil, "<<": "not a merge", "10": "ten",
			"tricky": []any{"true", "null", "<<", "10", "a: b", "#x", ""},
			"nested": map[string]any{"list": []any{1, "two", map[string]any{"three": 3}}},
		}),
		newer(&desc{Key: "plan", Value: "paid", RateLimit: limit(minute, 100)}, true, nil),
	}}},
	{"tricky_strings", &rlc{Name: "tricky/strings: #1", Domain: "null", Descriptors: []*desc{
		{Key: "true", Value: "~", RateLimit: limit(second, 1)},
		{Key: "<<", Value: "*", RateLimit: limit(second, 1)},
		{Key: "- x", Value: "a: b #c", RateLimit: limit(second, 1)},
		{Key: "multi\nline\ttab", Value: "ünïcødé ✓", RateLimit: limit(second, 1)},
		{Key: " lead", Value: "trail ", RateLimit: limit(second, 1)},
		{Key: "0x10", Value: "1e3", RateLimit: limit(second, 1)},
	}}},

	{"unit_unknown", &rlc{Name: "unit_unknown", Domain: "d", Descriptors: []*desc{
		{Key: "k", RateLimit: limit(unknownUnit, 10)},
	}}},
	{"unit_number", &rlc{Name: "unit_number", Domain: "d", Descriptors: []*desc{
		{Key: "k", RateLimit: limit(rlsconfv3.RateLimitUnit(42), 10)},
	}}},
	{"empty_key", &rlc{Name: "empty_key", Domain: "d", Descriptors: []*desc{
		{Key: "", RateLimit: limit(second, 10)},
		{Key: "ok", Descriptors: []*desc{{Value: "v", RateLimit: limit(second, 1)}}},
	}}},
	{"empty_domain", &rlc{Name: "empty_domain", Descriptors: []*desc{{Key: "k", RateLimit: limit(second, 1)}}}},
	{"unlimited_with_unit", &rlc{Name: "unlimited_with_unit", Domain: "d", Descriptors: []*desc{
		{Key: "k", RateLimit: &pol{Unlimited: true, Unit: second}},
	}}},
	{"replaces", &rlc{Name: "replaces", Domain: "d", Descriptors: []*desc{
		{Key: "a", RateLimit: &pol{Unit: second, RequestsPerUnit: 1, Name: "a", Replaces: replaces("a")}},
		{Key: "b", RateLimit: &pol{Unit: second, RequestsPerUnit: 1, Replaces: replaces("")}},
	}}},
	{"duplicate_key", &rlc{Name: "duplicate_key", Domain: "d", Descriptors: []*desc{
		{Key: "a", Value: "b_c", RateLimit: limit(second, 1)},
		{Key: "a_b", Value: "c", RateLimit: limit(second, 1)},
	}}},
	{"metadata_nan", &rlc{Name: "metadata_nan", Domain: "d", Descriptors: []*desc{
		newer(&desc{Key: "k", RateLimit: limit(second, 1)}, false, map[string]any{"x": nanValue()}),
	}}},
	{"too_deep", &rlc{Name: "too_deep", Domain: "d", Descriptors: nested(descriptors.MaxDepth + 5)}},
	{"metadata_too_deep", &rlc{Name: "metadata_too_deep", Domain: "d", Descriptors: []*desc{
		newer(&desc{Key: "k", RateLimit: limit(second, 1)}, false, deepMetadata(descriptors.MaxDepth+5)),
	}}},
	{"unknown_fields", withUnknown(&rlc{Name: "unknown_fields", Domain: "d", Descriptors: []*desc{
		withUnknown(&desc{Key: "k", RateLimit: withUnknown(&pol{Unit: second, RequestsPerUnit: 1, Replaces: []*rlsconfv3.RateLimitReplace{
			withUnknown(&rlsconfv3.RateLimitReplace{Name: "x"}, unknownField(3)),
		}}, unknownField(6))}, unknownField(9)),
	}}, unknownField(4))},
}

func nanValue() any {
	zero := 0.0
	return zero / zero
}

// TestConvert renders each case, compiles it through the same path as an
// update from the server, and compares both with the goldens.
func TestConvert(t *testing.T) {
	for _, tc := range convertCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res, err := anypb.New(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			base := filepath.Join("testdata", "convert", tc.name)
			f, ferr := fromAny(0, res)
			if ferr == nil {
				testutil.Golden(t, base+".yaml", string(f.Data))
			} else if _, err := os.Stat(base + ".yaml"); err == nil && !testutil.Updating() {
				t.Errorf("rendering failed (%v), but %s.yaml exists", ferr, base)
			}
			set, err := compile([]*anypb.Any{res}, descriptors.CompileOptions{})
			if ferr != nil && (err == nil || err.Error() != ferr.Error()) {
				t.Fatalf("compile error %v, want the rendering error %v", err, ferr)
			}
			if err != nil {
				testutil.Golden(t, base+".err", err.Error()+"\n")
				if len(descriptors.Errors(err)) == 0 {
					t.Errorf("error without a position: %v", err)
				}
				return
			}
			testutil.Golden(t, base+".dump", set.Dump())
		})
	}
}

// TestSameAsFile: a resource and the YAML file an operator would write for it
// compile to the same rules.
func TestSameAsFile(t *testing.T) {
	yamlFile := `domain: messaging
descriptors:
  - key: message_type
    value: marketing
    descriptors:
      - key: to_number
        rate_limit: {unit: day, requests_per_unit: 5}
  - key: to_number
    detailed_metric: true
    rate_limit: {unit: day, requests_per_unit: 100}
  - key: remote_address
    value: "10.*"
    shadow_mode: true
    rate_limit:
      unit: minute
      requests_per_unit: 30
      name: wide
      replaces: [{name: narrow}]
  - key: remote_address
    value: 10.0.0.1
    rate_limit: {unit: second, requests_per_unit: 2, name: narrow}
`
	fromFile, err := descriptors.Compile(descriptors.File{Name: "messaging.yaml", Data: []byte(yamlFile)})
	if err != nil {
		t.Fatal(err)
	}
	res, err := anypb.New(convertCases[0].cfg)
	if err != nil {
		t.Fatal(err)
	}
	fromXDS, err := compile([]*anypb.Any{res}, descriptors.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pos := regexp.MustCompile(` @\S+`)
	if a, b := pos.ReplaceAllString(fromFile.Dump(), ""), pos.ReplaceAllString(fromXDS.Dump(), ""); a != b || fromXDS.Len() != 5 {
		t.Fatalf("from the file:\n%s\nfrom xDS:\n%s", a, b)
	}
}

// TestCompileResources covers what only a whole response has: several
// resources, a domain defined twice, duplicate names, foreign and unreadable
// resources, and no resources at all.
func TestCompileResources(t *testing.T) {
	if TypeURL != resource.RateLimitConfigType {
		t.Fatalf("TypeURL %q, go-control-plane says %q", TypeURL, resource.RateLimitConfigType)
	}
	pack := func(c proto.Message) *anypb.Any {
		a, err := anypb.New(c)
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	one := pack(&rlc{Name: "one", Domain: "one", Descriptors: []*desc{{Key: "k", RateLimit: limit(second, 1)}}})
	two := pack(&rlc{Name: "two", Domain: "two", Descriptors: []*desc{{Key: "k", RateLimit: limit(second, 1)}}})
	twoAgain := pack(&rlc{Name: "two-again", Domain: "two"})
	sameName := pack(&rlc{Name: "one", Domain: "three"})
	badUnit := pack(&rlc{Name: "bad", Domain: "bad", Descriptors: []*desc{{Key: "k", RateLimit: limit(unknownUnit, 1)}}})
	foreign := pack(&structpb.Struct{})
	garbage := &anypb.Any{TypeUrl: TypeURL, Value: []byte{0xff, 0xff}}

	for _, tc := range []struct {
		name      string
		resources []*anypb.Any
		domains   int
		want      []string // the lines of the error, exactly
	}{
		{"none", nil, 0, nil},
		{"two", []*anypb.Any{one, two}, 2, nil},
		{"duplicate domain", []*anypb.Any{one, two, twoAgain}, 0, []string{
			"xds:two-again:1:1: domain: duplicate domain 'two' in config file ..."}},
		{"duplicate name", []*anypb.Any{one, sameName}, 0, []string{
			"xds:one:1:1: resources[1]: resource name given twice"}},
		{"foreign type", []*anypb.Any{one, foreign}, 0, []string{
			`xds:resources[1]:1:1: resource of type "type.googleapis.com/google.protobuf.Struct", want "` + TypeURL + `"`}},
		{"every problem at once", []*anypb.Any{garbage, badUnit, foreign}, 0, []string{
			"xds:resources[0]:1:1: unmarshal RateLimitConfig: ",
			`xds:resources[2]:1:1: resource of type "type.googleapis.com/google.protobuf.Struct", want "` + TypeURL + `"`,
			"xds:bad:5:15: descriptors[0].rate_limit.unit: invalid rate limit unit 'UNKNOWN'"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			set, err := compile(tc.resources, descriptors.CompileOptions{})
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				if len(set.Domains()) != tc.domains {
					t.Fatalf("%d domains, want %d", len(set.Domains()), tc.domains)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			got := strings.Split(err.Error(), "\n")
			if len(got) != len(tc.want) {
				t.Fatalf("errors:\n%v\nwant:\n%s", err, strings.Join(tc.want, "\n"))
			}
			for i := range got {
				// An unmarshal error's wording is protobuf's, and how a duplicate
				// domain names the other file is descriptors'; only their starts
				// are this package's.
				prefix, cut := strings.CutSuffix(tc.want[i], " ...")
				if !cut && strings.HasSuffix(prefix, ": ") {
					cut = true
				}
				if got[i] != tc.want[i] && !(cut && strings.HasPrefix(got[i], prefix)) {
					t.Errorf("error %d:\n%s\nwant:\n%s", i, got[i], tc.want[i])
				}
			}
			var de *descriptors.Error
			if !errors.As(err, &de) {
				t.Errorf("not a *descriptors.Error: %v", err)
			}
		})
	}
}

// TestParseNodeMetadata: upstream's documented formats, both separators.
func TestParseNodeMetadata(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    map[string]string
		wantErr string
	}{
		{"", nil, ""},
		{" , ", nil, ""},
		{"k1:v1,k2=v2", map[string]string{"k1": "v1", "k2": "v2"}, ""},
		{"url=http://x:1/a=b, zone : eu-1 ,", map[string]string{"url": "http://x:1/a=b", "zone": "eu-1"}, ""},
		{"a:b=c", map[string]string{"a:b": "c"}, ""},
		{"k=1,k=2", map[string]string{"k": "2"}, ""},
		{"k=", map[string]string{"k": ""}, ""},
		{"novalue,=x", nil, `parse node metadata: node metadata entry "novalue": want key=value or key:value` + "\n" + `node metadata entry "=x": empty key`},
	} {
		got, err := ParseNodeMetadata(tc.in)
		if tc.wantErr != "" {
			if err == nil || err.Error() != tc.wantErr {
				t.Errorf("%q: error %v, want %s", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil || len(got) != len(tc.want) {
			t.Errorf("%q: %v %v, want %v", tc.in, got, err, tc.want)
			continue
		}
		for k, v := range tc.want {
			if got[k] != v {
				t.Errorf("%q: %v, want %v", tc.in, got, tc.want)
			}
		}
	}
}

// TestBackoff: the delays double from Initial to Max, jitter stays within its
// factor, and a negative jitter turns it off.
func TestBackoff(t *testing.T) {
	c := Config{ServerURL: "x", Apply: func(*descriptors.Set) error { return nil }}
	if err := c.normalize(); err != nil {
		t.Fatal(err)
	}
	b := c.Backoff
	if b.Initial != DefaultBackoffInitial || b.Max != DefaultBackoffMax || b.Jitter != DefaultBackoffJitter || c.NodeID != "default" {
		t.Fatalf("defaults %+v, node %q", b, c.NodeID)
	}
	b.Jitter = -1
	for i, want := range []int{10, 20, 40, 60, 60} {
		if got := b.delay(i, 0.99); got.Seconds() != float64(want) {
			t.Errorf("attempt %d: %s, want %ds", i, got, want)
		}
	}
	b.Jitter = 0.5
	for i := range 10 {
		for _, r := range []float64{0, 0.5, 0.999} {
			d := b.delay(i, r)
			base := min(b.Initial<<i, b.Max)
			if d < base/2 || d > b.Max || (r == 0.5 && d != base) {
				t.Errorf("attempt %d r %g: %s (base %s)", i, r, d, base)
			}
		}
	}
	for _, bad := range []Config{
		{Apply: c.Apply},
		{ServerURL: "x"},
		{ServerURL: "x", Apply: c.Apply, Backoff: Backoff{Jitter: 1.5}},
		{ServerURL: "x", Apply: c.Apply, Backoff: Backoff{Initial: -1}},
		{ServerURL: "x", Apply: c.Apply, MaxMessageBytes: -1},
	} {
		if _, err := New(bad); err == nil {
			t.Errorf("New(%+v) accepted", bad)
		}
	}
}
