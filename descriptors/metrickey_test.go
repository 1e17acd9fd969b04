package descriptors

import (
	"testing"
)

const metricKeyConfig = `
domain: d
descriptors:
  - key: route
    value_to_metric: true
    descriptors:
      - key: method
        value_to_metric: true
        descriptors:
          - key: user
            rate_limit: {unit: minute, requests_per_unit: 60}
  - key: k1
    value_to_metric: true
    descriptors:
      - key: k2
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: plain
    descriptors:
      - key: inner
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: fixed
    value: v
    value_to_metric: true
    descriptors:
      - key: inner
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: det
    descriptors:
      - key: leaf
        detailed_metric: true
        value_to_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: wild
    value: "foo*"
    value_to_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: pat
    value: "foo*"
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: shared
    value: "foo*"
    share_threshold: true
    value_to_metric: true
    descriptors:
      - key: leaf
        detailed_metric: true
        rate_limit: {unit: second, requests_per_unit: 1}
  - key: emptyval
    detailed_metric: true
    rate_limit: {unit: second, requests_per_unit: 1}
`

// TestMetricKey: the stats key a decision is counted under is upstream's, for
// detailed_metric and value_to_metric at every level, not only the last
// entry's value.
func TestMetricKey(t *testing.T) {
	cases := []struct {
		req    []string
		varies bool
		want   string
	}{
		{[]string{"route=draw", "method=GET", "user=123"}, true, "d.route_draw.method_GET.user"},
		{[]string{"k1=A", "k2=foo"}, true, "d.k1_A.k2"},
		{[]string{"plain=x", "inner=y"}, false, "d.plain.inner"},
		{[]string{"fixed=v", "inner=y"}, false, "d.fixed_v.inner"},
		{[]string{"det=a", "leaf=b"}, true, "d.det_a.leaf_b"},
		{[]string{"wild=foobar"}, true, "d.wild_foobar"},
		{[]string{"pat=foobar"}, false, "d.pat_foo*"},
		{[]string{"shared=food", "leaf=z"}, true, "d.shared_foo*.leaf_z"},
		{[]string{"emptyval="}, true, "d.emptyval_"},
	}
	set := mustParse(t, metricKeyConfig)
	for _, tc := range cases {
		t.Run(tc.want, func(t *testing.T) {
			r := set.Match("d", entries(tc.req...))
			if r == nil {
				t.Fatalf("%v matched no rule", tc.req)
			}
			if got := r.MetricKeyVaries(); got != tc.varies {
				t.Errorf("MetricKeyVaries = %v, want %v", got, tc.varies)
			}
			if got := string(r.AppendMetricKey(nil, entries(tc.req...))); got != tc.want {
				t.Errorf("key = %q, want %q", got, tc.want)
			}
			if !tc.varies && r.Path() != tc.want {
				t.Errorf("Path = %q, but the key does not vary and is %q", r.Path(), tc.want)
			}
		})
	}
}
