package descriptors

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"math/bits"
	"sync"
	"sync/atomic"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// Caps on one request. Envoy's largest honest requests are far below them; they
// bound the work a broken or hostile caller can ask for. Exceeding one is bad
// input (InvalidArgument), never a crash.
const (
	MaxDescriptors = 64
	MaxEntries     = 32
	MaxKeyBytes    = 256
	MaxValueBytes  = 4096
	MaxHits        = math.MaxUint32
)

// Code is a decision's code: the wire enum, so the server passes it through.
type Code = rlsv3.RateLimitResponse_Code

// Codes of a decision.
const (
	OK        = rlsv3.RateLimitResponse_OK
	OverLimit = rlsv3.RateLimitResponse_OVER_LIMIT
)

// ErrInvalidRequest is matched (errors.Is) by every *RequestError.
var ErrInvalidRequest = errors.New("invalid request")

// RequestError is bad input in a request, naming the field at fault.
type RequestError struct {
	Field string
	Msg   string
}

func (e *RequestError) Error() string { return e.Field + ": " + e.Msg }

// Is makes errors.Is(err, ErrInvalidRequest) true.
func (e *RequestError) Is(target error) bool { return target == ErrInvalidRequest }

// Status is the decision for one request descriptor.
type Status struct {
	Code rlsv3.RateLimitResponse_Code
	// Rule is the rule that matched, nil for an override or no match.
	Rule *Rule
	// Limit is the limit applied; nil means no limit (no current_limit).
	Limit *Limit
	// Remaining estimates the tokens left cluster-wide: local tokens ÷ weight,
	// floored and capped at the burst.
	Remaining uint32
	// Reset is the time until the bucket is full (OK) or holds enough tokens for
	// this request (OVER_LIMIT).
	Reset time.Duration
	// Wait is how long the answer must be held for a wait-policy reservation.
	Wait time.Duration
	// Shadowed: the rule is in shadow mode and the decision would have been
	// OVER_LIMIT.
	Shadowed bool
	// Replaced: the limit was dropped because another matched limit replaces it.
	Replaced bool
	// Overflow: the store was at its cap and the rule's overflow bucket was used.
	Overflow bool
	// Override: the limit came from the request, not the config.
	Override bool

	drawn float64 // the tokens the request asked for, to give back a reservation
}

// installed is a Set with the per-rule hashes the store keys start from.
type installed struct {
	set      *Set
	ids      []uint64 // by Rule.ID
	overflow []uint64 // by Rule.ID
}

type overrideSpec struct {
	rpu  uint32
	unit Unit
	mult uint32
}

// maxInterned bounds the distinct override limits kept for reuse; past it an
// override's Limit is built per new bucket, which costs an allocation, not state.
const maxInterned = 1024

// Engine decides requests. It holds the current Set, the current weight and the
// buckets. It is safe for concurrent use: Decide takes no engine-wide lock, and a
// Swap or SetWeight is seen by the next Decide.
type Engine struct {
	cur       atomic.Pointer[installed]
	weight    atomic.Pointer[bucket.Weight]
	store     *bucket.Store
	seed      maphash.Seed
	overrides atomic.Pointer[map[overrideSpec]*Limit]
	ovMu      sync.Mutex
}

// NewEngine returns an engine deciding with set at weight w, keeping buckets in
// store. It starts no goroutines; the caller runs Sweep.
func NewEngine(set *Set, w float64, store *bucket.Store) *Engine {
	e := &Engine{store: store, seed: maphash.MakeSeed()}
	e.weight.Store(bucket.InitialWeight(w))
	e.overrides.Store(&map[overrideSpec]*Limit{})
	if set == nil {
		set = &Set{Domains: map[string]*Domain{}}
	}
	e.Swap(set)
	return e
}

// Swap installs set and returns the set it replaced. Buckets of every rule whose
// domain, path and limit are unchanged keep their state: their keys are derived
// from exactly those, so the new set finds them where the old one left them.
func (e *Engine) Swap(set *Set) *Set {
	in := &installed{set: set, ids: make([]uint64, len(set.Rules)), overflow: make([]uint64, len(set.Rules))}
	for i, r := range set.Rules {
		in.ids[i] = maphash.String(e.seed, r.identity)
		in.overflow[i] = mix(in.ids[i], 0x6f766572666c6f77) // "overflow"
	}
	old := e.cur.Swap(in)
	if old == nil {
		return nil
	}
	return old.set
}

// Set returns the installed set.
func (e *Engine) Set() *Set { return e.cur.Load().set }

// Store returns the bucket store.
func (e *Engine) Store() *bucket.Store { return e.store }

// Weight returns the current weight epoch.
func (e *Engine) Weight() *bucket.Weight { return e.weight.Load() }

// SetWeight re-divides every limit: from now on each bucket refills at w's
// share, keeping its fill ratio. Buckets adopt it lazily on their next use.
func (e *Engine) SetWeight(w float64, now int64) {
	if !(w > 0) || w > 1 {
		return // a weight outside (0,1] is a bug upstream of here; keep the last
	}
	for {
		old := e.weight.Load()
		if old.W == w {
			return
		}
		if e.weight.CompareAndSwap(old, old.Next(w, now)) {
			return
		}
	}
}

// Sweep drops buckets that have refilled to full; see bucket.Store.Sweep.
func (e *Engine) Sweep(now int64) int { return e.store.Sweep(e.weight.Load(), now) }

// Validate checks a request against the caps and the rules of SPEC 2.4 without
// deciding it.
func Validate(domain string, descs []*commonv3.RateLimitDescriptor) error {
	if domain == "" {
		return &RequestError{"domain", "must not be empty"}
	}
	if len(descs) == 0 {
		return &RequestError{"descriptors", "at least one descriptor is required"}
	}
	if len(descs) > MaxDescriptors {
		return &RequestError{"descriptors", fmt.Sprintf("%d descriptors, at most %d allowed", len(descs), MaxDescriptors)}
	}
	for i, d := range descs {
		if d == nil {
			return &RequestError{fmt.Sprintf("descriptors[%d]", i), "is null"}
		}
		if len(d.Entries) == 0 {
			return &RequestError{fmt.Sprintf("descriptors[%d].entries", i), "at least one entry is required"}
		}
		if len(d.Entries) > MaxEntries {
			return &RequestError{fmt.Sprintf("descriptors[%d].entries", i), fmt.Sprintf("%d entries, at most %d allowed", len(d.Entries), MaxEntries)}
		}
		for j, en := range d.Entries {
			switch {
			case en == nil:
				return &RequestError{fmt.Sprintf("descriptors[%d].entries[%d]", i, j), "is null"}
			case en.Key == "":
				return &RequestError{fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), "must not be empty"}
			case len(en.Key) > MaxKeyBytes:
				return &RequestError{fmt.Sprintf("descriptors[%d].entries[%d].key", i, j), fmt.Sprintf("%d bytes, at most %d allowed", len(en.Key), MaxKeyBytes)}
			case len(en.Value) > MaxValueBytes:
				return &RequestError{fmt.Sprintf("descriptors[%d].entries[%d].value", i, j), fmt.Sprintf("%d bytes, at most %d allowed", len(en.Value), MaxValueBytes)}
			}
		}
		if d.HitsAddend != nil && d.HitsAddend.Value > MaxHits {
			return &RequestError{fmt.Sprintf("descriptors[%d].hits_addend", i), fmt.Sprintf("%d, at most %d allowed", d.HitsAddend.Value, uint64(MaxHits))}
		}
		if o := d.Limit; o != nil {
			if o.Unit <= 0 || o.Unit > 6 {
				return &RequestError{fmt.Sprintf("descriptors[%d].limit.unit", i), fmt.Sprintf("unit %s is not a valid unit", o.Unit)}
			}
			if o.RequestsPerUnit == 0 {
				return &RequestError{fmt.Sprintf("descriptors[%d].limit.requests_per_unit", i), "must be at least 1"}
			}
			if m := o.GetUnitMultiplier().GetValue(); !WindowOK(Unit(o.Unit), m) {
				return &RequestError{fmt.Sprintf("descriptors[%d].limit.unit_multiplier", i),
					fmt.Sprintf("a window of %d %ss is longer than the %d-year maximum", m, Unit(o.Unit), MaxWindow/Year.Duration())}
			}
		}
	}
	return nil
}

// Decision is the answer to one request.
type Decision struct {
	// Statuses has one status per request descriptor, in order.
	Statuses []Status
	// Code is OVER_LIMIT if any non-shadow descriptor is over its limit, and OK
	// otherwise; never UNKNOWN.
	Code Code
	// Set is the set the request was decided with. A reload may install another
	// the moment Decide returns; whatever reads the statuses' rules (metrics,
	// by rule ID) must read them against this set, never the current one.
	Set *Set
}

// Decide answers one request. hits is the request's hits_addend; now is on the
// engine's clock. out is reused when large enough, so a caller that keeps it
// decides without allocating. Bad input returns a *RequestError and changes no
// bucket.
func (e *Engine) Decide(domain string, descs []*commonv3.RateLimitDescriptor, hits uint32, now int64, out []Status) (Decision, error) {
	in := e.cur.Load()
	if err := Validate(domain, descs); err != nil {
		return Decision{Statuses: out[:0], Code: OK, Set: in.set}, err
	}
	if cap(out) < len(descs) {
		out = make([]Status, len(descs))
	}
	out = out[:len(descs)]
	dom := in.set.Domains[domain]
	for i, d := range descs {
		st := &out[i]
		*st = Status{Code: OK}
		if dom == nil {
			continue // unknown domain: OK, no limit, as upstream
		}
		if d.Limit != nil {
			st.Limit, st.Override = e.override(d.Limit), true
			continue
		}
		if r := match(&dom.root, d.Entries, nil); r != nil {
			st.Rule, st.Limit = r, r.Limit
		}
	}
	if in.set.hasReplaces {
		markReplaced(out)
	}
	wt := e.weight.Load()
	overall := OK
	for i, d := range descs {
		st := &out[i]
		lim := st.Limit
		if lim == nil || st.Replaced {
			continue
		}
		if lim.Unlimited {
			st.Remaining = math.MaxUint32
			continue
		}
		op, n := bucket.Draw, float64(max(hits, 1))
		if d.HitsAddend != nil {
			n = float64(d.HitsAddend.Value)
			if n == 0 {
				op = bucket.Check
			}
		}
		if d.IsNegativeHits {
			op = bucket.GiveBack
		}
		var req bucket.Request
		if st.Override {
			req.Key, req.OverflowKey = e.overrideKeys(domain, d)
		} else {
			req.Key = e.ruleKey(in, st.Rule, d.Entries)
			req.OverflowKey = in.overflow[st.Rule.ID]
		}
		req.Params, req.Op, req.N = &lim.Params, op, n
		st.drawn = n
		res, ovf := e.store.Do(req, wt, now)
		st.Overflow = ovf
		st.Reset, st.Wait = res.Reset, res.Wait
		if lim.Params.Blocked() {
			st.Reset = lim.Window()
		}
		if res.OK {
			st.Remaining = remaining(res.Tokens, wt.W, lim.Burst)
		} else if st.Rule != nil && st.Rule.ShadowMode {
			st.Shadowed = true
		} else {
			// As upstream: an OVER_LIMIT descriptor has nothing left, whatever
			// fraction of a token the local bucket holds.
			st.Code = OverLimit
			overall = OverLimit
		}
	}
	if overall == OverLimit {
		e.cancelWaits(in, domain, descs, out, wt, now)
	}
	return Decision{Statuses: out, Code: overall, Set: in.set}, nil
}

// cancelWaits gives back the tokens that wait-policy descriptors reserved in a
// request answered OVER_LIMIT anyway: holding that answer would only delay a
// refusal, and the reservation would spend tokens on a request that never
// passes.
func (e *Engine) cancelWaits(in *installed, domain string, descs []*commonv3.RateLimitDescriptor, out []Status, wt *bucket.Weight, now int64) {
	for i := range out {
		st := &out[i]
		if st.Wait == 0 {
			continue
		}
		req := bucket.Request{Params: &st.Limit.Params, Op: bucket.GiveBack, N: st.drawn}
		switch {
		case st.Override:
			req.Key, req.OverflowKey = e.overrideKeys(domain, descs[i])
		default:
			req.Key, req.OverflowKey = e.ruleKey(in, st.Rule, descs[i].Entries), in.overflow[st.Rule.ID]
		}
		if st.Overflow {
			req.Key = req.OverflowKey
		}
		res, _ := e.store.Do(req, wt, now)
		st.Wait, st.Reset = 0, res.Reset
		st.Remaining = remaining(res.Tokens, wt.W, st.Limit.Burst)
	}
}

// markReplaced drops, within one request, every limit named in another matched
// limit's replaces.
func markReplaced(out []Status) {
	replacements(len(out), func(i int) *Limit { return out[i].Limit }, func(_, dropped int, _ string) {
		out[dropped].Replaced = true
	})
	for i := range out {
		if out[i].Replaced {
			out[i].Limit = nil
		}
	}
}

// replacements calls drop for every pair of a request's n limits where the
// limit at by names the limit at dropped in its replaces. limit(i) is nil for a
// descriptor without a limit. Decide and Explain share it, so what explain
// reports is what a decision does.
func replacements(n int, limit func(int) *Limit, drop func(by, dropped int, name string)) {
	for i := 0; i < n; i++ {
		li := limit(i)
		if li == nil || len(li.Replaces) == 0 {
			continue
		}
		for j := 0; j < n; j++ {
			lj := limit(j)
			if j == i || lj == nil || lj.Name == "" {
				continue
			}
			for _, name := range li.Replaces {
				if name == lj.Name {
					drop(i, j, name)
				}
			}
		}
	}
}

func remaining(tokens, w float64, burst uint64) uint32 {
	if tokens <= 0 || w <= 0 {
		return 0
	}
	r := math.Floor(tokens/w + 1e-9)
	r = math.Min(r, float64(burst))
	return uint32(math.Min(r, math.MaxUint32))
}

// ruleKey is the bucket of rule r for these entries: the rule's identity plus
// the value at every depth that picks a bucket (key-only and wildcard levels,
// except wildcards with share_threshold, whose matches share one bucket).
func (e *Engine) ruleKey(in *installed, r *Rule, entries []*commonv3.RateLimitDescriptor_Entry) uint64 {
	k := in.ids[r.ID]
	for i, v := range r.varying {
		if v {
			k = mix(k, maphash.String(e.seed, entries[i].Value))
		}
	}
	return k
}

// overrideKeys are the bucket of a request's own limit, keyed by the domain, the
// limit and the entries, and the overflow bucket it shares past the cap with
// every other request of the same domain and limit. The entries are the
// client's to choose; the overflow key must not depend on them, or a flood of
// distinct values would open a bucket each.
func (e *Engine) overrideKeys(domain string, d *commonv3.RateLimitDescriptor) (key, overflow uint64) {
	k := mix(maphash.String(e.seed, domain), 0x6f76657272696465) // "override"
	o := d.Limit
	k = mix(k, uint64(o.RequestsPerUnit)<<32|uint64(o.Unit))
	k = mix(k, uint64(max(o.GetUnitMultiplier().GetValue(), 1)))
	overflow = mix(k, 0x6f766572666c6f77) // "overflow"
	for _, en := range d.Entries {
		k = mix(k, maphash.String(e.seed, en.Key))
		k = mix(k, maphash.String(e.seed, en.Value))
	}
	return k, overflow
}

// mix combines two 64-bit hashes (a 128-bit multiply folded, as in wyhash).
func mix(a, b uint64) uint64 {
	hi, lo := bits.Mul64(a^0xa0761d6478bd642f, b^0xe7037ed1a0b428db)
	return hi ^ lo
}

// override returns the Limit for a request's own limit, interned so repeated
// overrides share one Limit (and one current_limit message).
func (e *Engine) override(o *commonv3.RateLimitDescriptor_RateLimitOverride) *Limit {
	spec := overrideSpec{rpu: o.RequestsPerUnit, unit: Unit(o.Unit), mult: max(o.GetUnitMultiplier().GetValue(), 1)}
	if l := (*e.overrides.Load())[spec]; l != nil {
		return l
	}
	l := &Limit{RequestsPerUnit: spec.rpu, Unit: spec.unit, UnitMultiplier: spec.mult}
	l.finish()
	e.ovMu.Lock()
	defer e.ovMu.Unlock()
	cur := *e.overrides.Load()
	if x := cur[spec]; x != nil {
		return x
	}
	if len(cur) >= maxInterned {
		return l
	}
	next := make(map[overrideSpec]*Limit, len(cur)+1)
	for k, v := range cur {
		next[k] = v
	}
	next[spec] = l
	e.overrides.Store(&next)
	return l
}

// Clock returns nanoseconds on a monotonic scale starting near zero, the time
// base the engine and its buckets use.
func Clock() func() int64 {
	start := time.Now()
	return func() int64 { return int64(time.Since(start)) }
}
