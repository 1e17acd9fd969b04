package engine

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// TestReplacesNeverDropsUnlimited decides requests against
// testdata/valid/replaces_unlimited.yaml. Upstream's constructLimitsToCheck
// collects every matched limit's replaces, unlimited ones included, then sets
// the unlimited limits aside before it drops the named ones: replaces can
// only drop a limit that is not unlimited. An unlimited descriptor answers OK
// with limit_remaining MaxUint32 and is never a quota descriptor, even under
// global quota mode, whether another rule names it in replaces or not.
func TestReplacesNeverDropsUnlimited(t *testing.T) {
	set, err := compileFiles(t, "../testdata/valid/replaces_unlimited.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name  string
		quota bool     // global quota mode
		descs []string // each "k=v", decided together once
		want  string   // overall code, then each status: code, limit, remaining, replaced
	}{
		{"an unlimited rule named in replaces stays unlimited", false,
			[]string{"a=x", "b=y"},
			"OK | OK unlimited rem=4294967295 | OK 5/hour rem=4"},
		{"order does not matter", false,
			[]string{"b=y", "a=x"},
			"OK | OK 5/hour rem=4 | OK unlimited rem=4294967295"},
		{"global quota: the unlimited rule is no quota descriptor, so the blocked one alone refuses", true,
			[]string{"a=x", "blocked=y"},
			"OVER_LIMIT | OK unlimited rem=4294967295 | OVER_LIMIT 0/hour rem=0"},
		{"without quota mode the blocked rule refuses too", false,
			[]string{"a=x", "blocked=y"},
			"OVER_LIMIT | OK unlimited rem=4294967295 | OVER_LIMIT 0/hour rem=0"},
		{"an unlimited rule's own replaces still drop the limit it names", false,
			[]string{"free=x", "limited=y"},
			"OK | OK unlimited rem=4294967295 | OK none rem=0 replaced"},
		{"alone, the limit an unlimited rule replaces applies", false,
			[]string{"limited=y"},
			"OVER_LIMIT | OVER_LIMIT 0/hour rem=0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEngine(t, set, bucket.NewStore(0), Options{QuotaMode: tc.quota})
			descs := descsOf(tc.descs)
			sts, code, err := decide(e, "replaces_unlimited", descs, 0, 0, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := []string{code.String()}
			for _, st := range sts {
				got = append(got, statusSummary(st))
			}
			if g := strings.Join(got, " | "); g != tc.want {
				t.Errorf("decide:\n  got  %s\n  want %s", g, tc.want)
			}
			// explain must drop exactly what Decide drops, and show every
			// unlimited descriptor as unlimited.
			var replaced, unlimited []int
			for i, st := range sts {
				if st.Replaced {
					replaced = append(replaced, i+1)
				}
				if st.Limit != nil && st.Limit.Unlimited() {
					unlimited = append(unlimited, i+1)
				}
			}
			dropped, shown := explainReplaces(set, "replaces_unlimited", descs)
			if !slices.Equal(dropped, replaced) {
				t.Errorf("explain drops descriptors %v, Decide %v", dropped, replaced)
			}
			if !slices.Equal(shown, unlimited) {
				t.Errorf("explain shows descriptors %v as unlimited, Decide %v", shown, unlimited)
			}
		})
	}
}

func statusSummary(st Status) string {
	lim := "none"
	switch l := st.Limit; {
	case l == nil:
	case l.Unlimited():
		lim = "unlimited"
	default:
		lim = fmt.Sprintf("%d/%s", l.RequestsPerUnit(), strings.ToLower(l.Unit().String()))
	}
	s := fmt.Sprintf("%s %s rem=%d", st.Code, lim, st.Remaining)
	if st.Replaced {
		s += " replaced"
	}
	return s
}

var (
	explainDrop      = regexp.MustCompile(`(?m)^replaces: descriptor (\d+)'s limit`)
	explainUnlimited = regexp.MustCompile(`(?m)^descriptor (\d+) is limited by .*\n  unlimited: always OK`)
)

// explainReplaces is what Explain says of a request: the descriptors (from 1)
// that replaces drops, and those it shows as unlimited.
func explainReplaces(set *descriptors.Set, domain string, descs []*commonv3.RateLimitDescriptor) (dropped, unlimited []int) {
	entries := make([][]*commonv3.RateLimitDescriptor_Entry, len(descs))
	for i, d := range descs {
		entries[i] = d.Entries
	}
	var b strings.Builder
	descriptors.Explain(&b, set, domain, entries, 1)
	numbers := func(re *regexp.Regexp) []int {
		var out []int
		for _, m := range re.FindAllStringSubmatch(b.String(), -1) {
			n, _ := strconv.Atoi(m[1])
			out = append(out, n)
		}
		slices.Sort(out)
		return out
	}
	return numbers(explainDrop), numbers(explainUnlimited)
}
