package descriptors

import (
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// step records how one request entry was matched, for `sharelimit explain`.
type step struct {
	Key, Value string
	Rule       *Rule // nil: nothing matched at this depth
	Kind       MatchKind
}

// Match finds the rule for one descriptor's entries in domain, following
// upstream's rules exactly: at each depth take the exact key/value child, else
// the first wildcard child that matches in config order, else the key-only child;
// descend only while the matched rule has children; and return a rule only if it
// sits at exactly the depth of the last entry and carries a limit. There is no
// backtracking and no falling back to a parent's limit.
func (s *Set) Match(domain string, entries []*commonv3.RateLimitDescriptor_Entry) *Rule {
	d := s.domains[domain]
	if d == nil {
		return nil
	}
	return match(&d.root, entries, nil)
}

// trace is Match with a record of every depth, for explaining a decision.
func (s *Set) trace(domain string, entries []*commonv3.RateLimitDescriptor_Entry) (*Rule, []step) {
	d := s.domains[domain]
	if d == nil {
		return nil, nil
	}
	var steps []step
	r := match(&d.root, entries, &steps)
	return r, steps
}

func match(l *level, entries []*commonv3.RateLimitDescriptor_Entry, trace *[]step) *Rule {
	for i, e := range entries {
		r := l.lookup(e.GetKey(), e.GetValue())
		if trace != nil {
			st := step{Key: e.GetKey(), Value: e.GetValue(), Rule: r}
			if r != nil {
				st.Kind = r.kind
			}
			*trace = append(*trace, st)
		}
		if r == nil {
			return nil
		}
		if i == len(entries)-1 {
			if r.limit == nil {
				return nil
			}
			return r
		}
		if len(r.children.order) == 0 {
			return nil // the request is deeper than the config
		}
		l = &r.children
	}
	return nil
}

func (l *level) lookup(key, value string) *Rule {
	g := l.byKey[key]
	if g == nil {
		return nil
	}
	if value != "" {
		if r := g.exact[value]; r != nil {
			return r
		}
	}
	for _, r := range g.wild {
		if glob(r.value, value) {
			return r
		}
	}
	return g.def
}

// glob reports whether value matches pattern, where each '*' matches zero or
// more characters. It runs in O(len(pattern)·len(value)) at worst and allocates
// nothing: the classic greedy match with one backtrack point.
func glob(pattern, value string) bool {
	p, v := 0, 0
	star, mark := -1, 0
	for v < len(value) {
		switch {
		case p < len(pattern) && pattern[p] == '*':
			star, mark = p, v
			p++
		case p < len(pattern) && pattern[p] == value[v]:
			p++
			v++
		case star >= 0:
			p = star + 1
			mark++
			v = mark
		default:
			return false
		}
	}
	for p < len(pattern) && pattern[p] == '*' {
		p++
	}
	return p == len(pattern)
}
