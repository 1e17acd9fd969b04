package server

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// detailedValues are one rule path's series by stats key (upstream's
// domain.key_value... for each request), at most maxDetailedValues keys and
// then otherValue. Every bound set in which the
// rule is detailed shares them, so no reload can reset the cap and let clients
// mint another maxDetailedValues series.
//
// Counting a known value is an atomic load, a map lookup and an atomic add: the
// map is immutable, and replaced whole (copy on write) on the rare insert, under
// mu. Safe for concurrent use.
type detailedValues struct {
	vec          *prometheus.CounterVec
	domain, rule string
	vals         atomic.Pointer[map[string]*detailedEntry]
	// full is set once vals holds maxDetailedValues values; vals never
	// changes after that, so a miss can be settled without the lock.
	full  atomic.Bool
	other detailedEntry
	mu    sync.Mutex // serialises inserts, series creation and retire
	dead  bool       // guarded by mu: the series were deleted; create no more
}

// detailedEntry is one value's series. Each code's series is created on its
// first use, so a value exports only the codes it has seen.
type detailedEntry struct {
	value string
	codes [2]atomic.Pointer[counter] // by codeIndex
	// upstreamHits are the key's hits in upstream's terms (upstream.go),
	// counted only while upstream's series are on.
	upstreamHits
}

// counter boxes a prometheus.Counter for atomic.Pointer.
type counter struct{ prometheus.Counter }

func newDetailedValues(vec *prometheus.CounterVec, domain, rule string) *detailedValues {
	dv := &detailedValues{vec: vec, domain: domain, rule: rule, other: detailedEntry{value: otherValue}}
	dv.vals.Store(&map[string]*detailedEntry{})
	return dv
}

// inc counts one decision under key, upstream's stats key for it, and returns
// the entry it counted in (nil when the rule's series are gone). key is only
// read: the map keeps a copy.
func (dv *detailedValues) inc(key []byte, code int) *detailedEntry {
	e := (*dv.vals.Load())[string(key)]
	if e == nil && dv.full.Load() {
		// The insert that filled the map happened before full was set, so this
		// load sees the final map: the key is in it, or it is an other.
		if e = (*dv.vals.Load())[string(key)]; e == nil {
			e = &dv.other
		}
	}
	if e != nil {
		if c := e.codes[code].Load(); c != nil {
			c.Inc()
			return e
		}
	}
	return dv.slow(key, e, code)
}

// slow admits a new value, or creates a code's series, under the lock.
func (dv *detailedValues) slow(key []byte, e *detailedEntry, code int) *detailedEntry {
	dv.mu.Lock()
	defer dv.mu.Unlock()
	if dv.dead {
		// Unbind deleted the rule's series: one created now would be exported
		// forever for a rule that is gone. This late decision goes uncounted.
		return nil
	}
	if e == nil {
		vals := *dv.vals.Load()
		if e = vals[string(key)]; e == nil {
			if len(vals) >= maxDetailedValues {
				e = &dv.other
			} else {
				next := make(map[string]*detailedEntry, len(vals)+1)
				for k, v := range vals {
					next[k] = v
				}
				// The map outlives the request: keep a copy of the key.
				e = &detailedEntry{value: string(key)}
				next[e.value] = e
				dv.vals.Store(&next)
				if len(next) >= maxDetailedValues {
					dv.full.Store(true)
				}
			}
		}
	}
	c := e.codes[code].Load()
	if c == nil {
		c = &counter{dv.vec.WithLabelValues(dv.domain, dv.rule, e.value, codeName(code))}
		e.codes[code].Store(c)
	}
	c.Inc()
	return e
}

// retire deletes the rule's detailed series for good; slow creates none after
// it. Called under Metrics.mu when no bound set has the rule detailed.
func (dv *detailedValues) retire() {
	dv.mu.Lock()
	defer dv.mu.Unlock()
	dv.dead = true
	dv.vec.DeletePartialMatch(prometheus.Labels{"domain": dv.domain, "rule": dv.rule})
}
