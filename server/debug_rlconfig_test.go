package server

import (
	"strings"
	"testing"

	"github.com/sharelimit/sharelimit/descriptors"
)

// TestUpstreamRulesTextAsUpstreamDumps compares /rlconfig on the debug listener with
// the text upstream's rateLimitConfigImpl.Dump() prints for the same YAML
// (FullKey = domain + "." + key[_value] joined by "."; unit is the proto enum
// name, UNKNOWN for unlimited, requests_per_unit as given).
func TestUpstreamRulesTextAsUpstreamDumps(t *testing.T) {
	yml := `domain: d
descriptors:
  - key: a
    rate_limit: {unit: Second, requests_per_unit: 10}
    descriptors:
      - key: b
        value: "x*"
        shadow_mode: true
        rate_limit: {unit: minute, requests_per_unit: 5}
  - key: u
    rate_limit: {unlimited: true}
  - key: q
    value: v
    quota_mode: true
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 0}
  - key: w
    value: "*"
    rate_limit: {unit: day, requests_per_unit: 7}
  - key: dot
    value: "a.b:c"
    rate_limit: {unit: week, requests_per_unit: 3}
`
	set, err := descriptors.Parse("d.yaml", strings.NewReader(yml))
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	UpstreamRules(&b, set)
	want := `d.a: unit=SECOND requests_per_unit=10, shadow_mode: false, quota_mode: false
d.a.b_x*: unit=MINUTE requests_per_unit=5, shadow_mode: true, quota_mode: false
d.dot_a.b:c: unit=WEEK requests_per_unit=3, shadow_mode: false, quota_mode: false
d.q_v: unit=HOUR requests_per_unit=0, shadow_mode: false, quota_mode: true
d.u: unit=UNKNOWN requests_per_unit=0, shadow_mode: false, quota_mode: false
d.w_*: unit=DAY requests_per_unit=7, shadow_mode: false, quota_mode: false
`
	if got := b.String(); got != want {
		t.Errorf("got:\n%s\nwant (upstream's Dump):\n%s", got, want)
	}
}
