package descriptors

import (
	"fmt"
	"sort"
	"strings"
)

// Dump renders the compiled set as indented text, one rule a line, in config
// order: what `sharelimit check -v` prints and what the golden tests compare.
func (s *Set) Dump() string {
	var b strings.Builder
	names := make([]string, 0, len(s.domains))
	for n := range s.domains {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		d := s.domains[n]
		fmt.Fprintf(&b, "domain %s\n", d.name)
		dumpLevel(&b, d.file, &d.root, 1)
	}
	return b.String()
}

// dumpLevel writes the rules of l; file is the domain's first file, which a
// rule's position names only when the rule comes from another (a merged
// domain).
func dumpLevel(b *strings.Builder, file string, l *level, depth int) {
	for _, r := range l.order {
		b.WriteString(strings.Repeat("  ", depth))
		fmt.Fprintf(b, "%s [%s]", composite(r.key, r.value), r.kind)
		if r.limit != nil {
			fmt.Fprintf(b, " limit=%q", r.limit.String())
			if r.limit.name != "" {
				fmt.Fprintf(b, " name=%s", r.limit.name)
			}
			if len(r.limit.replaces) > 0 {
				fmt.Fprintf(b, " replaces=%s", strings.Join(r.limit.replaces, ","))
			}
			if !r.limit.unlimited {
				fmt.Fprintf(b, " rate=%.6g/s", r.limit.params.Rate)
				if r.PerValue() {
					b.WriteString(" per-value")
				}
				if r.limit.share != ShareCluster {
					fmt.Fprintf(b, " share=%s", r.limit.share)
				}
			}
		}
		for _, f := range []struct {
			on   bool
			name string
		}{{r.shadowMode, "shadow"}, {r.detailedMetric, "detailed_metric"}, {r.valueToMetric, "value_to_metric"}, {r.shareThreshold, "share_threshold"}, {r.quotaMode, "quota_mode"}} {
			if f.on {
				b.WriteString(" " + f.name)
			}
		}
		if len(r.metadata) > 0 {
			keys := make([]string, 0, len(r.metadata))
			for k := range r.metadata {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			fmt.Fprintf(b, " metadata=%s", strings.Join(keys, ","))
		}
		if r.pos.File != file {
			fmt.Fprintf(b, " @%s:%d:%d\n", r.pos.File, r.pos.Line, r.pos.Col)
		} else {
			fmt.Fprintf(b, " @%d:%d\n", r.pos.Line, r.pos.Col)
		}
		dumpLevel(b, file, &r.children, depth+1)
	}
}
