package descriptors

import (
	"fmt"
	"io"
	"slices"
	"strings"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// Bucket ids. An RLQS client (Envoy's rate_limit_quota filter) names a
// bucket by a map of strings, with no order, where RLS names it by a list
// of entries. MatchBucket puts the map in the order of the rule tree: every
// order of the id's keys that the tree holds is walked as upstream walks a
// descriptor (Match: exact value, then the first matching wildcard, then
// key-only, with no backtracking), and of the rules those walks reach at the
// id's full depth, the first in YAML order (depth-first, file order: the
// lowest ID) wins. So an id matches the rule RLS would match for the same
// entries in that order, and where two orders of the keys both lead
// somewhere, the rule written first wins, as a reader of the file expects.

// MatchBucket returns the rule an RLQS bucket id selects in d, and the id
// as the descriptor entries of that rule's path, in the path's key order;
// nil, nil when none does (an empty id, a key no path holds, a value no
// rule at its depth matches). The rule may have no limit, or an unlimited
// one: what that means is the caller's to decide (RLQS answers DENY_ALL to
// a rule without a limit, never unlimited by accident). It is pure and
// visits each rule of d at most once per key of the id.
func (d *Domain) MatchBucket(id map[string]string) (*Rule, []*commonv3.RateLimitDescriptor_Entry) {
	if d == nil || len(id) == 0 {
		return nil, nil
	}
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys) // the walk's result does not depend on it; its cost stays the same run to run
	used := make([]bool, len(keys))
	best := matchBucket(&d.root, id, keys, used, 1, nil)
	if best == nil {
		return nil, nil
	}
	entries := make([]*commonv3.RateLimitDescriptor_Entry, best.depth)
	for r := best; r != nil; r = r.parent {
		entries[r.depth-1] = &commonv3.RateLimitDescriptor_Entry{Key: r.key, Value: id[r.key]}
	}
	return best, entries
}

// matchBucket walks l at depth with every key of the id not used above,
// and returns the first rule in YAML order (lowest ID) that a walk reaches
// at the id's full depth, or best when none comes before it.
func matchBucket(l *level, id map[string]string, keys []string, used []bool, depth int, best *Rule) *Rule {
	for i, k := range keys {
		if used[i] {
			continue
		}
		r := l.lookup(k, id[k])
		if r == nil {
			continue
		}
		if depth == len(keys) {
			if best == nil || r.id < best.id {
				best = r
			}
			continue
		}
		if len(r.children.order) == 0 {
			continue
		}
		used[i] = true
		best = matchBucket(&r.children, id, keys, used, depth+1, best)
		used[i] = false
	}
	return best
}

// ExplainBucket writes which rule an RLQS bucket id selects in domain and
// why, what RLQS assigns for it, and, for a rule with a limit, the same
// account of the limit, share and bucket that Explain gives a descriptor.
func ExplainBucket(out io.Writer, set *Set, domain string, id map[string]string, w float64) {
	fmt.Fprintf(out, "domain %q, weight %.4g: this replica enforces that share of every limit\n", domain, w)
	fmt.Fprintf(out, "\nbucket id: %s\n", formatBucketID(id))
	d := set.domains[domain]
	if d == nil {
		fmt.Fprintf(out, "\nno file defines domain %q: RLQS answers DENY_ALL (a bucket id no rule matches is never unlimited)\n", domain)
		return
	}
	r, entries := d.MatchBucket(id)
	if r == nil {
		fmt.Fprintf(out, "\nno rule matches: no path of the rule tree has exactly these keys with values that match them, in any order\n")
		fmt.Fprintf(out, "  result: DENY_ALL (a bucket id no rule matches is never unlimited)\n")
		return
	}
	fmt.Fprintf(out, "\nmatched as the descriptor %s (the first rule in file order that a walk in some order of the keys reaches)\n", formatEntries(entries))
	_, steps := set.trace(domain, entries)
	explainSteps(out, d, steps, len(entries))
	switch l := r.limit; {
	case l == nil:
		fmt.Fprintf(out, "  RLQS: DENY_ALL: the rule has no rate_limit, and a bucket without a limit is never unlimited by accident\n")
	case l.unlimited:
		fmt.Fprintf(out, "  RLQS: ALLOW_ALL: the rule says unlimited\n")
	case r.shadowMode:
		explainLimit(out, "the bucket", r, entries, w)
		fmt.Fprintf(out, "  RLQS: ALLOW_ALL: the rule is in shadow_mode, so its limit is counted over RLS, not enforced\n")
	case l.params.Blocked():
		fmt.Fprintf(out, "  RLQS: DENY_ALL: requests_per_unit 0 admits nothing\n")
	default:
		explainLimit(out, "the bucket", r, entries, w)
		fmt.Fprintf(out, "  RLQS: a token bucket: this replica's share above, divided among the Envoy streams reporting the bucket and this replica's RLS draws on it, by their demand (DENY_ALL while a stream's part is under one token; ALLOW_ALL under the global --shadow-mode)\n")
	}
}

// formatBucketID is an id's pairs sorted by key, as "k=v, k2=v2".
func formatBucketID(id map[string]string) string {
	keys := make([]string, 0, len(id))
	for k := range id {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + "=" + id[k]
	}
	return strings.Join(keys, ", ")
}
