package descriptors

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
)

// assemble joins parsed domains into a Set: it refuses a domain defined twice,
// numbers the rules, and gives each the identity its buckets are keyed by.
func assemble(domains []*Domain, files []string, opts CompileOptions) (*Set, error) {
	s := &Set{domains: map[string]*Domain{}, files: files}
	var errs []error
	for _, d := range domains {
		prev, dup := s.domains[d.name]
		switch {
		case dup && opts.MergeDomains:
			errs = append(errs, mergeDomain(prev, d)...)
		case dup:
			errs = append(errs, &Error{Pos: d.pos, Path: "domain",
				Msg: fmt.Sprintf("duplicate domain '%s' in config file (also at %s)", d.name, prev.pos)})
		default:
			s.domains[d.name] = d
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	names := make([]string, 0, len(s.domains))
	for n := range s.domains {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		return s.domains[names[i]].file+"\x00"+names[i] < s.domains[names[j]].file+"\x00"+names[j]
	})
	for _, n := range names {
		s.number(&s.domains[n].root)
	}
	return s, nil
}

// mergeDomain adds the top-level rules of d, a later file's part of the same
// domain, to into. A rule whose composite key into already has is refused,
// naming where the first one stands.
func mergeDomain(into, d *Domain) []error {
	var errs []error
	for _, r := range d.root.order {
		if first := into.root.add(r); first != nil {
			errs = append(errs, &Error{Pos: r.pos, Path: "descriptors",
				Msg: fmt.Sprintf("duplicate descriptor composite key '%s' (first at %s)", r.path, first.pos)})
		}
	}
	return errs
}

// number appends the rules of l and below to s.rules, depth-first.
func (s *Set) number(l *level) {
	for _, r := range l.order {
		r.id = len(s.rules)
		r.identity = ruleIdentity(r) + "\x00" + varyingSig(r)
		if r.limit != nil {
			// The share is part of it: a bucket's weight history belongs to
			// its share's weight group, so a bucket cannot move from one
			// share to another. The limit's figures (requests_per_unit,
			// unit, unit_multiplier, burst, policy, max_wait) are not: a
			// reload that changes them keeps the rule's buckets, which keep
			// their fill ratio (engine.Engine.Swap).
			r.identity += "\x00share=" + r.limit.share.String()
			if len(r.limit.replaces) > 0 {
				s.hasReplaces = true
			}
		}
		s.rules = append(s.rules, r)
		s.number(&r.children)
	}
}

// ruleIdentity names a rule by its domain and the key and value at every
// depth, each part prefixed with its length. The dotted path cannot serve:
// domain "a.b" with key "c" and domain "a" with key "b.c" have the same path,
// and their rules would share buckets across domains.
func ruleIdentity(r *Rule) string {
	var parts []string
	for x := r; x != nil; x = x.parent {
		parts = append(parts, x.value, x.key)
	}
	parts = append(parts, r.domain)
	var b []byte
	for i := len(parts) - 1; i >= 0; i-- {
		b = strconv.AppendInt(b, int64(len(parts[i])), 10)
		b = append(b, ':')
		b = append(b, parts[i]...)
	}
	return string(b)
}

func varyingSig(r *Rule) string {
	b := make([]byte, len(r.varying))
	for i, v := range r.varying {
		b[i] = '0'
		if v {
			b[i] = '1'
		}
	}
	return string(b)
}
