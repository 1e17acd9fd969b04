package server

import (
	"sync"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sharelimit/sharelimit/descriptors"

	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// The parts of a response that depend only on a rule (its current_limit and
// its metadata) are built by the service from the set, once per rule, and
// never from the metrics, which only count.

// setParts are the response parts of the rules of one set, by Rule.ID. Each
// is built on the rule's first decision, so installing a set costs nothing on
// the request path but one slice.
type setParts struct {
	set   *descriptors.Set
	rules []atomic.Pointer[ruleParts]
}

// ruleParts are one rule's response parts. Only this package holds them,
// they never change once built, and grpc-go and mergeStruct only read them.
type ruleParts struct {
	// limit is the rule's current_limit; nil when it has no limit or is
	// unlimited.
	limit *rlsv3.RateLimitResponse_RateLimit
	// metadata is the rule's metadata for dynamic metadata; nil when none.
	metadata *structpb.Struct
}

// partsCache holds the parts of the set in force. A request decided with a
// set that has been replaced since (in flight across a reload) gets none, and
// so messages of its own, with the same content.
type partsCache struct {
	cur atomic.Pointer[setParts]
	mu  sync.Mutex // serialises replacing cur
}

// replace returns the parts of set, made the cached ones, or nil when set is
// not the engine's set in force. Answer reads cur first, so only the first
// requests after a reload, and those in flight across it, come here.
func (c *partsCache) replace(set *descriptors.Set, engine *engine.Engine) *setParts {
	if set == nil || set != engine.Set() {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if p := c.cur.Load(); p != nil && p.set == set {
		return p
	}
	p := &setParts{set: set, rules: make([]atomic.Pointer[ruleParts], set.Len())}
	c.cur.Store(p)
	return p
}

// rule returns the parts of a config rule's decision; nil for an override,
// when p is nil, or when the status's rule is not p's set's own.
func (p *setParts) rule(st *engine.Status) *ruleParts {
	if p == nil || st.Override || st.Rule == nil {
		return nil
	}
	id := st.Rule.ID()
	if id >= len(p.rules) || p.set.Rule(id) != st.Rule {
		return nil
	}
	if rp := p.rules[id].Load(); rp != nil {
		return rp
	}
	return p.build(id, st.Rule)
}

// build makes the parts of rule r, p's rule id, on its first decision.
func (p *setParts) build(id int, r *descriptors.Rule) *ruleParts {
	rp := &ruleParts{limit: currentLimit(r.Limit()), metadata: ruleMetadata(r)}
	if !p.rules[id].CompareAndSwap(nil, rp) {
		rp = p.rules[id].Load()
	}
	return rp
}

// limit is the rule's current_limit for a decision; nil for an override, or
// when p is nil or not the status's set. It repeats rule's checks so that the
// hot path makes one call per status.
func (p *setParts) limit(st *engine.Status) *rlsv3.RateLimitResponse_RateLimit {
	if p != nil && !st.Override && st.Rule != nil {
		if id := st.Rule.ID(); id < len(p.rules) && p.set.Rule(id) == st.Rule {
			rp := p.rules[id].Load()
			if rp == nil {
				rp = p.build(id, st.Rule)
			}
			return rp.limit
		}
	}
	return nil
}

// metadata is the metadata of a config rule's decision; nil for an override.
func (p *setParts) metadata(st *engine.Status) *structpb.Struct {
	if st.Override || st.Rule == nil {
		return nil
	}
	if rp := p.rule(st); rp != nil {
		return rp.metadata
	}
	return ruleMetadata(st.Rule)
}
