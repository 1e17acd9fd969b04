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
	names := make([]string, 0, len(s.Domains))
	for n := range s.Domains {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		d := s.Domains[n]
		fmt.Fprintf(&b, "domain %s\n", d.Name)
		dumpLevel(&b, &d.root, 1)
	}
	return b.String()
}

func dumpLevel(b *strings.Builder, l *level, depth int) {
	for _, r := range l.order {
		b.WriteString(strings.Repeat("  ", depth))
		fmt.Fprintf(b, "%s [%s]", composite(r.Key, r.Value), r.Kind)
		if r.Limit != nil {
			fmt.Fprintf(b, " limit=%q", r.Limit.String())
			if r.Limit.Name != "" {
				fmt.Fprintf(b, " name=%s", r.Limit.Name)
			}
			if len(r.Limit.Replaces) > 0 {
				fmt.Fprintf(b, " replaces=%s", strings.Join(r.Limit.Replaces, ","))
			}
			if !r.Limit.Unlimited {
				fmt.Fprintf(b, " rate=%.6g/s", r.Limit.Params.Rate)
				if r.PerValue() {
					b.WriteString(" per-value")
				}
			}
		}
		for _, f := range []struct {
			on   bool
			name string
		}{{r.ShadowMode, "shadow"}, {r.DetailedMetric, "detailed_metric"}, {r.ValueToMetric, "value_to_metric"}, {r.ShareThreshold, "share_threshold"}, {r.QuotaMode, "quota_mode"}} {
			if f.on {
				b.WriteString(" " + f.name)
			}
		}
		if len(r.Metadata) > 0 {
			keys := make([]string, 0, len(r.Metadata))
			for k := range r.Metadata {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			fmt.Fprintf(b, " metadata=%s", strings.Join(keys, ","))
		}
		fmt.Fprintf(b, " @%d:%d\n", r.Pos.Line, r.Pos.Col)
		dumpLevel(b, &r.children, depth+1)
	}
}
