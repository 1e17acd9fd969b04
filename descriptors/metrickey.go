package descriptors

import (
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
)

// Upstream's stats key for one decision. A rule's Path is the key its
// statistics have when nothing about the request changes them:
// domain.key_value.key2... with each level as written in the config. Two
// settings make the key depend on the request, and upstream builds it as
// below, so dashboards keyed by it keep working:
//   - detailed_metric on the matched rule: every entry of the request as
//     key_value (key_ when the value is empty), except that an entry matched by
//     a share_threshold wildcard keeps the pattern (key_value* ...);
//   - value_to_metric on a level matched by key alone or by a wildcard
//     without share_threshold: that level shows the request's value.

// MetricKeyVaries reports whether the rule's stats key depends on the
// request's values: when it does not, Path is the key.
func (r *Rule) MetricKeyVaries() bool {
	if r.detailedMetric {
		return true
	}
	for x := r; x != nil; x = x.parent {
		if x.valueToMetric && x.kind != Exact && !x.shareThreshold {
			return true
		}
	}
	return false
}

// AppendMetricKey appends to dst upstream's stats key for a request whose
// entries r matched: one entry per level, r at the last. Entries that do not
// fit r (another count) give Path.
func (r *Rule) AppendMetricKey(dst []byte, entries []*commonv3.RateLimitDescriptor_Entry) []byte {
	if len(entries) != r.depth {
		return append(dst, r.path...)
	}
	var chain [MaxDepth + 1]*Rule
	for x := r; x != nil; x = x.parent {
		chain[x.depth-1] = x
	}
	dst = append(dst, r.domain...)
	shared := false
	for i := range r.depth {
		shared = shared || chain[i].kind == Wildcard && chain[i].shareThreshold
	}
	for i, e := range entries {
		dst = append(dst, '.')
		dst = append(dst, e.GetKey()...)
		if r.detailedMetric && !shared {
			dst = append(dst, '_') // upstream writes key_value, even for an empty value
			dst = append(dst, e.GetValue()...)
			continue
		}
		if v := chain[i].metricValue(r.detailedMetric, e.GetValue()); v != "" {
			dst = append(dst, '_')
			dst = append(dst, v...)
		}
	}
	return dst
}

// metricValue is what level x shows after its key in a stats key, given the
// request's value there: the share_threshold pattern; the request's value when
// detailed, exact or value_to_metric; a wildcard's pattern; else nothing.
func (x *Rule) metricValue(detailed bool, value string) string {
	switch {
	case x.kind == Wildcard && x.shareThreshold:
		return x.value
	case detailed, x.kind == Exact, x.valueToMetric:
		return value
	case x.kind == Wildcard:
		return x.value
	}
	return ""
}
