package descriptors

import (
	"fmt"
	"io"
	"strings"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/sharelimit/sharelimit/internal/human"
)

// Explain writes, for each request descriptor, which rule matched at each
// depth and why, the limit that applies (cluster-wide and this replica's share
// at weight w), the bucket it draws from, and what replaces dropped. It answers
// the question upstream's users ask most, how nested descriptors match, without
// reading code.
func Explain(out io.Writer, set *Set, domain string, descs [][]*commonv3.RateLimitDescriptor_Entry, w float64) {
	fmt.Fprintf(out, "domain %q, weight %.4g: this replica enforces that share of every limit\n", domain, w)
	d := set.domains[domain]
	if d == nil {
		fmt.Fprintf(out, "\nno file defines domain %q: every descriptor is OK with no limit (as upstream)\n", domain)
		return
	}
	matched := make([]*Rule, len(descs))
	for i, entries := range descs {
		fmt.Fprintf(out, "\ndescriptor %d: %s\n", i+1, formatEntries(entries))
		r, steps := set.trace(domain, entries)
		matched[i] = r
		explainSteps(out, d, steps, len(entries))
	}
	// replaces, across the request's descriptors
	replaced := make([]bool, len(matched))
	limit := func(i int) *Limit {
		if matched[i] == nil {
			return nil
		}
		return matched[i].limit
	}
	Replacements(len(matched), limit, func(by, dropped int, name string) {
		fmt.Fprintf(out, "\nreplaces: descriptor %d's limit %q is dropped because descriptor %d's rule %s replaces it: descriptor %d gets OK with no limit\n",
			dropped+1, name, by+1, matched[by].path, dropped+1)
		replaced[dropped] = true
	})
	for i, r := range matched {
		if r != nil && !replaced[i] {
			explainLimit(out, fmt.Sprintf("descriptor %d", i+1), r, descs[i], w)
		}
	}
}

func formatEntries(entries []*commonv3.RateLimitDescriptor_Entry) string {
	parts := make([]string, len(entries))
	for i, e := range entries {
		parts[i] = e.GetKey() + "=" + e.GetValue()
	}
	return strings.Join(parts, ", ")
}

func explainSteps(out io.Writer, d *Domain, steps []step, depth int) {
	for i, st := range steps {
		fmt.Fprintf(out, "  depth %d  %s=%q: ", i+1, st.Key, st.Value)
		r := st.Rule
		switch {
		case r == nil:
			fmt.Fprintf(out, "no rule for key %q at this depth (no exact value, no wildcard, no key-only rule)\n", st.Key)
			fmt.Fprintf(out, "  result: no limit: OK with no current_limit\n")
			return
		case r.kind == Exact:
			fmt.Fprintf(out, "exact rule %s (%s)\n", r.path, r.pos)
		case r.kind == Wildcard:
			fmt.Fprintf(out, "wildcard rule %s: pattern %q is the first wildcard that matches, in config order (%s)\n", r.path, r.value, r.pos)
		default:
			if st.Value == "" {
				fmt.Fprintf(out, "key-only rule %s: an empty value matches only key-only rules or value \"*\" (%s)\n", r.path, r.pos)
			} else {
				fmt.Fprintf(out, "key-only rule %s: no exact rule for this value and no wildcard matched (%s)\n", r.path, r.pos)
			}
		}
		last := i == depth-1
		switch {
		case last && r.limit == nil:
			fmt.Fprintf(out, "  result: no limit: the rule at the request's last depth has no rate_limit, and a parent's limit never applies to a deeper request\n")
		case !last && len(r.Children()) == 0:
			fmt.Fprintf(out, "  result: no limit: the request has %d entries but the config ends at depth %d; limits apply only at exactly the depth of the last entry\n", depth, i+1)
			return
		}
	}
}

func explainLimit(out io.Writer, what string, r *Rule, entries []*commonv3.RateLimitDescriptor_Entry, w float64) {
	l := r.limit
	fmt.Fprintf(out, "\n%s is limited by %s", what, r.path)
	if l.name != "" {
		fmt.Fprintf(out, " (name %q)", l.name)
	}
	fmt.Fprintln(out)
	if l.unlimited {
		fmt.Fprintf(out, "  unlimited: always OK, limit_remaining %d\n", uint32(1<<32-1))
		return
	}
	fmt.Fprintf(out, "  cluster-wide: %s (refills %s, bucket of %s)\n", l, human.Rate(l.params.Rate, l.unit.String()), human.Count(uint64(l.burst)))
	if l.share == ShareReplica {
		fmt.Fprintf(out, "  share: replica: not divided by the weight; every replica enforces the whole limit on its own\n")
		w = 1
	}
	if l.share == ShareDemand && r.PerValue() {
		fmt.Fprintf(out, "  share: demand, per value: the rule's hottest values (up to --demand-top-keys) are divided by the replicas' demand; every other value keeps the equal share below (/rlconfig lists the hot values and their shares)\n")
	} else if l.share == ShareDemand {
		fmt.Fprintf(out, "  share: demand: divided by the replicas' demand; the share below is the equal share, which applies until the service's leader publishes a division (explain --admin shows the share in force)\n")
	}
	if l.params.Blocked() {
		fmt.Fprintf(out, "  local share: 0: requests_per_unit 0 blocks every request on every replica\n")
	} else {
		rate, size := l.params.Local(w)
		fmt.Fprintf(out, "  local share: %s, bucket of %s", human.Rate(rate, l.unit.String()), human.Number(size))
		if l.params.Size*w < 1 {
			fmt.Fprintf(out, " (B·w = %.3g is below 1: floored at 1 so this replica can pass a request)", l.params.Size*w)
		}
		fmt.Fprintln(out)
	}
	var key []string
	for i, v := range r.varying {
		if v {
			key = append(key, entries[i].GetKey()+"="+entries[i].GetValue())
		}
	}
	if len(key) == 0 {
		what := "one bucket for the rule"
		if r.shareThreshold {
			what = "one bucket shared by every value matching the pattern (share_threshold)"
		}
		fmt.Fprintf(out, "  bucket: %s [%s]\n", r.path, what)
	} else {
		fmt.Fprintf(out, "  bucket: %s [%s] (one bucket per distinct value)\n", r.path, strings.Join(key, ", "))
	}
	if r.shadowMode {
		fmt.Fprintf(out, "  shadow mode: an over-limit decision is reported OK and counted\n")
	}
	if l.policy == Wait {
		fmt.Fprintf(out, "  policy wait: an empty bucket holds the answer up to %s for tokens\n", l.maxWait)
	}
}
