package xds

import (
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sharelimit/sharelimit/descriptors"
)

// FuzzConvert decodes arbitrary bytes as a RateLimitConfig, as an update from
// a server would be, and converts and compiles it: no panic, every error has
// a position, and a set that compiles holds exactly the resource's domain,
// keys and values, however they are spelled.
func FuzzConvert(f *testing.F) {
	for _, tc := range convertCases {
		b, err := proto.Marshal(tc.cfg)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := compile([]*anypb.Any{{TypeUrl: TypeURL, Value: data}}, descriptors.CompileOptions{})
		if err != nil {
			if len(descriptors.Errors(err)) == 0 {
				t.Fatalf("error without a position: %v", err)
			}
			return
		}
		var c rlc
		if err := proto.Unmarshal(data, &c); err != nil {
			t.Fatalf("compiled what does not unmarshal: %v", err)
		}
		d := set.Domain(c.GetDomain())
		if d == nil || len(set.Domains()) != 1 {
			t.Fatalf("domain %q not in the set", c.GetDomain())
		}
		sameRules(t, c.GetDescriptors(), d.Rules())
	})
}

// sameRules checks that rules are the descriptors, level by level.
func sameRules(t *testing.T, ds []*desc, rules []*descriptors.Rule) {
	t.Helper()
	if len(ds) != len(rules) {
		t.Fatalf("%d rules for %d descriptors", len(rules), len(ds))
	}
	for i, d := range ds {
		r := rules[i]
		if r.Key() != d.GetKey() || r.Value() != d.GetValue() || r.ShadowMode() != d.GetShadowMode() || r.DetailedMetric() != d.GetDetailedMetric() {
			t.Fatalf("rule %q=%q, descriptor %q=%q", r.Key(), r.Value(), d.GetKey(), d.GetValue())
		}
		if l := d.GetRateLimit(); (l == nil) != (r.Limit() == nil) ||
			l != nil && (r.Limit().Unlimited() != l.GetUnlimited() || !l.GetUnlimited() && (r.Limit().RequestsPerUnit() != l.GetRequestsPerUnit() || int32(r.Limit().Unit()) != int32(l.GetUnit()))) {
			t.Fatalf("rule %s has limit %v, descriptor %v", r.Path(), r.Limit(), l)
		}
		sameRules(t, d.GetDescriptors(), r.Children())
	}
}

// TestMetadataValues: metadata reaches the rule with the values and types it
// has in the Struct.
func TestMetadataValues(t *testing.T) {
	want := map[string]any{"s": "x", "n": 1.5, "i": 3.0, "b": false, "z": nil, "<<": "v",
		"l": []any{"true", 2.0, map[string]any{"k": "null"}}}
	c := &rlc{Name: "m", Domain: "d", Descriptors: []*desc{newer(&desc{Key: "k", RateLimit: limit(second, 1)}, false, want)}}
	res, err := anypb.New(c)
	if err != nil {
		t.Fatal(err)
	}
	set, err := compile([]*anypb.Any{res}, descriptors.CompileOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got := set.Domain("d").Rules()[0].Metadata()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("metadata %#v, want %#v", got, want)
	}
	if _, err := structpb.NewStruct(got); err != nil {
		t.Fatal(err)
	}
}
