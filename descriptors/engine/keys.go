package engine

import (
	"math/bits"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

type overrideSpec struct {
	rpu  uint32
	unit descriptors.Unit
	mult uint32
}

// override is a request's own limit and its bucket figures.
type override struct {
	limit  *descriptors.Limit
	params bucket.Params
}

// maxInterned bounds the distinct override limits kept for reuse; past it an
// override's Limit is built per request, which costs allocations, not state.
const maxInterned = 1024

// ruleKey is the bucket of the rule of info for these entries: the rule's
// identity plus the value at every depth that picks a bucket (key-only and
// wildcard levels, except wildcards with share_threshold, whose matches
// share one bucket).
func (e *Engine) ruleKey(info *ruleInfo, entries []*commonv3.RateLimitDescriptor_Entry) uint64 {
	k := info.key
	for _, i := range info.picks {
		k = mix(k, keyHash(e.seed, entries[i].Value))
	}
	return k
}

// overrideKeys are the bucket of a request's own limit, keyed by the domain, the
// limit and the entries, and the overflow bucket it shares past the cap with
// every other request of the same domain and limit. The entries are the
// client's to choose; the overflow key must not depend on them, or a flood of
// distinct values would open a bucket each.
func (e *Engine) overrideKeys(domain string, d *commonv3.RateLimitDescriptor) (key, overflow uint64) {
	k := mix(keyHash(e.seed, domain), 0x6f76657272696465) // "override"
	o := d.Limit
	k = mix(k, uint64(o.RequestsPerUnit)<<32|uint64(o.Unit))
	k = mix(k, uint64(max(o.GetUnitMultiplier().GetValue(), 1)))
	overflow = mix(k, 0x6f766572666c6f77) // "overflow"
	for _, en := range d.Entries {
		k = mix(k, keyHash(e.seed, en.Key))
		k = mix(k, keyHash(e.seed, en.Value))
	}
	return k, overflow
}

// mix combines two 64-bit hashes (a 128-bit multiply folded, as in wyhash).
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a^0xa0761d6478bd642f, b^0xe7037ed1a0b428db)
	return hi ^ lo
}

// override returns a request's own limit, interned so repeated overrides
// share one Limit (and one current_limit message).
func (e *Engine) override(o *commonv3.RateLimitDescriptor_RateLimitOverride) *override {
	spec := overrideSpec{rpu: o.RequestsPerUnit, unit: descriptors.Unit(o.Unit), mult: max(o.GetUnitMultiplier().GetValue(), 1)}
	if l := (*e.overrides.Load())[spec]; l != nil {
		return l
	}
	lim := descriptors.RequestLimit(spec.rpu, spec.unit, spec.mult)
	l := &override{limit: lim, params: lim.Params()}
	e.ovMu.Lock()
	defer e.ovMu.Unlock()
	cur := *e.overrides.Load()
	if x := cur[spec]; x != nil {
		return x
	}
	if len(cur) >= maxInterned {
		return l
	}
	next := make(map[overrideSpec]*override, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	next[spec] = l
	e.overrides.Store(&next)
	return l
}
