package engine

// A randomized differential of replaces, unlimited, quota_mode
// (per rule and global) and shadow_mode against upstream's
// constructLimitsToCheck and shouldRateLimitWorker, written out from
// envoyproxy/ratelimit's src/service/ratelimit.go.

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

type revRule struct {
	key           string
	name          string
	replaces      []string
	unlimited     bool
	rpu           int // 0 blocks
	quota, shadow bool
}

func (r revRule) yaml() string {
	var b strings.Builder
	fmt.Fprintf(&b, "  - key: %s\n", r.key)
	if r.quota {
		b.WriteString("    quota_mode: true\n")
	}
	if r.shadow {
		b.WriteString("    shadow_mode: true\n")
	}
	b.WriteString("    rate_limit:\n")
	if r.unlimited {
		b.WriteString("      unlimited: true\n")
	} else {
		fmt.Fprintf(&b, "      unit: hour\n      requests_per_unit: %d\n", r.rpu)
	}
	if r.name != "" {
		fmt.Fprintf(&b, "      name: %s\n", r.name)
	}
	if len(r.replaces) > 0 {
		b.WriteString("      replaces:\n")
		for _, n := range r.replaces {
			fmt.Fprintf(&b, "        - name: %s\n", n)
		}
	}
	return b.String()
}

// upstreamDecide is upstream's answer: each descriptor's code, and overall.
func upstreamDecide(rules map[string]revRule, req []string, globalQuota bool) ([]string, string) {
	limits := make([]*revRule, len(req))
	unl := make([]bool, len(req))
	replacing := map[string]bool{}
	for i, k := range req {
		if r, ok := rules[k]; ok {
			limits[i] = &r
			for _, n := range r.replaces {
				replacing[n] = true
			}
			if r.unlimited {
				unl[i], limits[i] = true, nil
			}
		}
	}
	for i, l := range limits {
		if l != nil && l.name != "" && replacing[l.name] {
			limits[i] = nil
		}
	}
	codes := make([]string, len(req))
	failedRate, failedQuota, totalQuota := 0, 0, 0
	for i := range req {
		if unl[i] {
			codes[i] = "OK"
			continue
		}
		over := limits[i] != nil && limits[i].rpu == 0
		if over && limits[i].shadow {
			over = false
		}
		codes[i] = "OK"
		quota := globalQuota || (limits[i] != nil && limits[i].quota)
		if over {
			codes[i] = "OVER_LIMIT"
			if quota {
				failedQuota++
			} else {
				failedRate++
			}
		}
		if quota {
			totalQuota++
		}
	}
	overall := "OK"
	if failedRate > 0 || (totalQuota > 0 && totalQuota == failedQuota) {
		overall = "OVER_LIMIT"
	}
	return codes, overall
}

func TestReplacesAgainstUpstreamsModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(31, 31))
	names := []string{"", "n0", "n1", "n2", "n3"}
	mismatches := 0
	for iter := 0; iter < 3000 && mismatches < 5; iter++ {
		rules := map[string]revRule{}
		var b strings.Builder
		b.WriteString("domain: rv\ndescriptors:\n")
		for k := range 5 {
			r := revRule{key: fmt.Sprintf("k%d", k), name: names[rng.IntN(len(names))], unlimited: rng.IntN(3) == 0,
				rpu: []int{0, 100}[rng.IntN(2)], quota: rng.IntN(3) == 0, shadow: rng.IntN(4) == 0}
			for _, n := range names[1:] {
				if n != r.name && rng.IntN(4) == 0 {
					r.replaces = append(r.replaces, n)
				}
			}
			rules[r.key] = r
			b.WriteString(r.yaml())
		}
		set, err := descriptors.Compile(descriptors.File{Name: "rv.yaml", Data: []byte(b.String())})
		if err != nil {
			t.Fatalf("compile:\n%s\n%v", b.String(), err)
		}
		for range 10 {
			n := 1 + rng.IntN(4)
			req := make([]string, n)
			kvs := make([]string, n)
			for i := range req {
				req[i] = fmt.Sprintf("k%d", rng.IntN(6)) // k5 matches nothing
				kvs[i] = req[i] + "=v"
			}
			for _, gq := range []bool{false, true} {
				e := newEngine(t, set, bucket.NewStore(0), Options{QuotaMode: gq})
				sts, code, err := decide(e, "rv", descsOf(kvs), 0, 0, nil)
				if err != nil {
					t.Fatal(err)
				}
				wantCodes, want := upstreamDecide(rules, req, gq)
				var got []string
				for _, st := range sts {
					c := st.Code.String()
					got = append(got, c)
				}
				if code.String() != want || strings.Join(got, ",") != strings.Join(wantCodes, ",") {
					mismatches++
					t.Errorf("global quota %v, request %v:\n  got  %s %v\n  want %s %v\nconfig:\n%s", gq, req, code, got, want, wantCodes, b.String())
				}
			}
		}
	}
}
