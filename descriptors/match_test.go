package descriptors

import (
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// entries builds request entries from "key=value" strings ("key=" is an empty value).
func entries(kvs ...string) []*commonv3.RateLimitDescriptor_Entry {
	out := make([]*commonv3.RateLimitDescriptor_Entry, len(kvs))
	for i, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		out[i] = &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	return out
}

func mustParse(t testing.TB, yaml string) *Set {
	t.Helper()
	s, err := Parse("test.yaml", strings.NewReader(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

const matchConfig = `
domain: d
descriptors:
  - key: k
    value: exact
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: k
    value: "ex*"
    rate_limit: {unit: second, requests_per_unit: 2}
  - key: k
    value: "e*"
    rate_limit: {unit: second, requests_per_unit: 3}
  - key: k
    rate_limit: {unit: second, requests_per_unit: 4}
  - key: star
    value: "*"
    rate_limit: {unit: second, requests_per_unit: 5}
  - key: mid
    value: "/a/*/b/*/c"
    rate_limit: {unit: second, requests_per_unit: 6}
  - key: parent
    value: p
    rate_limit: {unit: second, requests_per_unit: 7}
    descriptors:
      - key: child
        rate_limit: {unit: second, requests_per_unit: 8}
      - key: leafless
        value: x
  - key: shallow
    rate_limit: {unit: second, requests_per_unit: 9}
  - key: nolimit
    value: n
    descriptors:
      - key: c
        value: "v*"
        descriptors:
          - key: z
            rate_limit: {unit: second, requests_per_unit: 10}
  - key: trap
    value: exact
    descriptors:
      - key: deeper
        value: other
        rate_limit: {unit: second, requests_per_unit: 11}
  - key: trap
    descriptors:
      - key: deeper
        rate_limit: {unit: second, requests_per_unit: 12}
  - key: a_b
    value: y
    rate_limit: {unit: second, requests_per_unit: 13}
`

func TestMatch(t *testing.T) {
	set := mustParse(t, matchConfig)
	cases := []struct {
		name    string
		domain  string
		entries []string
		want    uint32 // requests_per_unit of the matched limit; 0 = no limit
	}{
		{"exact wins over wildcard and key-only", "d", []string{"k=exact"}, 1},
		{"first wildcard in config order", "d", []string{"k=exa"}, 2},
		{"later wildcard when the first does not match", "d", []string{"k=eagle"}, 3},
		{"key-only default", "d", []string{"k=zebra"}, 4},
		{"empty value skips exact and non-star wildcards", "d", []string{"k="}, 4},
		{"empty value matches value *", "d", []string{"star="}, 5},
		{"star matches anything", "d", []string{"star=whatever"}, 5},
		{"wildcard in the middle, several times", "d", []string{"mid=/a/x/y/b/z/c"}, 6},
		{"wildcard stars match zero chars", "d", []string{"mid=/a//b//c"}, 6},
		{"wildcard must match the end", "d", []string{"mid=/a/x/b/y/cd"}, 0},
		{"parent limit at its own depth", "d", []string{"parent=p"}, 7},
		{"child limit at depth 2", "d", []string{"parent=p", "child=anything"}, 8},
		{"no fallback to parent when child level has no limit", "d", []string{"parent=p", "leafless=x"}, 0},
		{"no fallback to parent when child unmatched", "d", []string{"parent=p", "unknown=1"}, 0},
		{"request deeper than config gets nothing", "d", []string{"shallow=1", "more=2"}, 0},
		{"request shallower than the limit gets nothing", "d", []string{"nolimit=n"}, 0},
		{"three levels with a wildcard in the middle", "d", []string{"nolimit=n", "c=vvv", "z=1"}, 10},
		{"no backtracking from exact to key-only", "d", []string{"trap=exact", "deeper=nope"}, 0},
		{"key-only path taken when exact absent", "d", []string{"trap=other", "deeper=nope"}, 12},
		{"exact path to deeper exact", "d", []string{"trap=exact", "deeper=other"}, 11},
		{"unknown key", "d", []string{"nokey=1"}, 0},
		// Upstream looks entries up by the joined string key_value, where
		// a=b_y and a_b=y are the same; we deliberately do not (README).
		{"key and value match apart, never joined", "d", []string{"a=b_y"}, 0},
		{"the rule's own key and value", "d", []string{"a_b=y"}, 13},
		{"unknown domain", "x", []string{"k=exact"}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := set.Match(tc.domain, entries(tc.entries...))
			var got uint32
			if r != nil {
				got = r.Limit().RequestsPerUnit()
			}
			if got != tc.want {
				t.Fatalf("matched %d, want %d (rule %+v)", got, tc.want, r)
			}
		})
	}
}

func TestGlob(t *testing.T) {
	cases := []struct {
		pattern, value string
		want           bool
	}{
		{"*", "", true},
		{"**", "", true},
		{"a*", "", false},
		{"a*", "a", true},
		{"*a", "bba", true},
		{"*a", "bab", false},
		{"a*b*c", "abc", true},
		{"a*b*c", "aXbYc", true},
		{"a*b*c", "aXbY", false},
		{"a*a*a", "aaa", true},
		{"a*a*a", "aa", false},
		{"*x*", "abc", false},
		{"/api/*", "/api/", true},
		{"/api/*", "/ap", false},
	}
	for _, tc := range cases {
		if got := glob(tc.pattern, tc.value); got != tc.want {
			t.Errorf("glob(%q, %q) = %v, want %v", tc.pattern, tc.value, got, tc.want)
		}
	}
}

func TestTrace(t *testing.T) {
	set := mustParse(t, matchConfig)
	r, steps := set.trace("d", entries("nolimit=n", "c=vee", "z=1"))
	if r == nil || len(steps) != 3 {
		t.Fatalf("rule %v steps %v", r, steps)
	}
	kinds := []MatchKind{Exact, Wildcard, KeyOnly}
	for i, st := range steps {
		if st.Kind != kinds[i] || st.Rule == nil {
			t.Errorf("step %d: %+v, want kind %s", i, st, kinds[i])
		}
	}
}
