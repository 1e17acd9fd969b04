package rlqs

import (
	"errors"
	"math"

	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// FromEngine is the rules engine as the service needs it.
func FromEngine(e *engine.Engine) Engine { return engineAdapter{e} }

type engineAdapter struct{ e *engine.Engine }

var _ Lease = leased{}

// Resolve maps the engine's BucketShare to a Target. A shadow-mode rule is
// Unlimited: RLS answers it OK whatever its bucket says.
func (a engineAdapter) Resolve(domain string, id map[string]string) Target {
	s := a.e.BucketShare(domain, id)
	r := s.Rule
	switch {
	case r == nil && (s.Set == nil || s.Set.Domain(domain) == nil):
		return Target{Kind: UnknownDomain}
	case r == nil:
		return Target{Kind: NoRule}
	case r.Limit() == nil:
		return Target{Kind: NoLimit, Rule: r.Path()}
	case r.Limit().Unlimited() || r.ShadowMode():
		return Target{Kind: Unlimited, Rule: r.Path()}
	case !(s.Rate > 0) && !(s.Burst > 0):
		return Target{Kind: NoLimit, Rule: r.Path()} // blocked: nothing to divide
	}
	window := int64(math.Ceil(r.Limit().Window().Seconds()))
	return Target{Kind: Limited, Rule: r.Path(), Key: s.Key, Rate: s.Rate, Burst: s.Burst, Weight: s.Weight,
		WindowSeconds: window, Ref: s}
}

// Lease leases t's key at its whole share: RLS had all of it until now.
func (a engineAdapter) Lease(t Target, now int64) (Lease, error) {
	s, ok := t.Ref.(engine.BucketShare)
	if !ok {
		return nil, errors.New("rlqs: lease: the target was not resolved by the engine")
	}
	// Whether RLS has drawn on the key lately: its bucket is in the store
	// (full ones are swept). Only its existence is read.
	_, drawn := a.e.Store().Peek(s.Key, a.e.Weight(), now)
	l, err := a.e.Lease(s.Rule, s.Key, s.Weight, now)
	if err != nil {
		return nil, err
	}
	return leased{l, drawn}, nil
}

// leased is an engine lease that also says whether RLS had drawn on the key
// before it (drawnBefore): the key's first Envoy limiter then does not start
// full, since the bucket it shares may be drained.
type leased struct {
	*engine.Lease
	drawn bool
}

func (l leased) DrawnBefore() bool { return l.drawn }

// Reported counts what an Envoy enforced itself in demand sharing's meters.
func (a engineAdapter) Reported(t Target, offered, admitted uint64) {
	if s, ok := t.Ref.(engine.BucketShare); ok {
		a.e.MeterReported(s, offered, admitted)
	}
}
