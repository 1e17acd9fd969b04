package engine

import (
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

const quotaConfig = `
domain: d
descriptors:
  - key: q1
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: q2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
  - key: hard
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: free
    quota_mode: true
    rate_limit: {unlimited: true}
  - key: qshadow
    quota_mode: true
    shadow_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
`

// TestQuotaMode: upstream answers OVER_LIMIT overall only when a descriptor
// not in quota mode is over, or when every quota-mode descriptor is over. An
// over quota descriptor still says OVER_LIMIT in its own status.
func TestQuotaMode(t *testing.T) {
	cases := []struct {
		name   string
		global bool
		descs  []string // each "k=v", decided together, three times
		want   string   // per decision: overall code, then each status
	}{
		{"one quota descriptor alone is refused when over", false,
			[]string{"q1=a"}, "O:O X:X X:X"},
		{"a quota descriptor over while another passes: OK", false,
			[]string{"q1=a", "q2=a"}, "O:OO O:XO X:XX"},
		{"a hard limit over refuses, quota or not", false,
			[]string{"q2=a", "hard=a"}, "O:OO X:OX X:XX"},
		{"no match beside a quota descriptor does not count as quota", false,
			[]string{"q1=a", "none=a"}, "O:OO X:XO X:XO"},
		{"unlimited is never a quota descriptor", false,
			[]string{"q1=a", "free=a"}, "O:OO X:XO X:XO"},
		{"a shadowed quota descriptor passes", false,
			[]string{"q1=a", "qshadow=a"}, "O:OO O:XO O:XO"},
		{"global: a hard rule becomes quota", true,
			[]string{"hard=a", "q2=a"}, "O:OO O:XO X:XX"},
		{"global: a descriptor with no limit counts as a passing quota one", true,
			[]string{"hard=a", "none=a"}, "O:OO O:XO O:XO"},
		{"global: alone, over is refused", true,
			[]string{"hard=a"}, "O:O X:X X:X"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := newDeciderWith(t, quotaConfig, Options{QuotaMode: tc.global})
			var got []string
			for range 3 {
				sts, code := d.decide(descsOf(tc.descs)...)
				var b strings.Builder
				b.WriteString(letter(code))
				b.WriteByte(':')
				for _, st := range sts {
					b.WriteString(letter(st.Code.String()))
				}
				got = append(got, b.String())
			}
			if g := strings.Join(got, " "); g != tc.want {
				t.Fatalf("got %s, want %s", g, tc.want)
			}
		})
	}
}

func descsOf(kvs []string) []*commonv3.RateLimitDescriptor {
	out := make([]*commonv3.RateLimitDescriptor, len(kvs))
	for i, kv := range kvs {
		out[i] = desc(kv)
	}
	return out
}

func letter(code string) string {
	if code == "OK" {
		return "O"
	}
	return "X"
}

// TestQuotaStatusFlag: Status.Quota says which descriptors are in quota mode.
func TestQuotaStatusFlag(t *testing.T) {
	d := newDecider(t, quotaConfig, 1)
	sts, _ := d.decide(desc("q1=a"), desc("hard=a"), desc("free=a"))
	if !sts[0].Quota || sts[1].Quota || sts[2].Quota {
		t.Fatalf("quota flags = %v %v %v, want true false false", sts[0].Quota, sts[1].Quota, sts[2].Quota)
	}
}
