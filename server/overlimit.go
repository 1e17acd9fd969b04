package server

import (
	"sort"
	"sync"
	"sync/atomic"
	"time"
)

// overLimitSample keeps a bounded, sampled record of recent over-limit keys for
// the status page. Only over-limit decisions touch it, and only one in
// sampleEvery of those takes its lock, so a flood of rejections costs an atomic
// add each. It never grows: a ring of the last ringSize samples.
type overLimitSample struct {
	n    atomic.Uint64
	mu   sync.Mutex
	ring [ringSize]overLimitKey
	next int
}

const (
	ringSize    = 256
	sampleEvery = 8
)

type overLimitKey struct {
	Domain, Rule, Value string
	At                  time.Time
}

// sample reports whether this over-limit decision is one to record.
func (s *overLimitSample) sample() bool { return s.n.Add(1)%sampleEvery == 1 }

func (s *overLimitSample) record(domain, rule, value string) {
	s.mu.Lock()
	s.ring[s.next] = overLimitKey{domain, rule, value, time.Now()}
	s.next = (s.next + 1) % ringSize
	s.mu.Unlock()
}

// TopKey is a key seen over limit recently, with its share of the samples.
type TopKey struct {
	Domain  string `json:"domain"`
	Rule    string `json:"rule"`
	Value   string `json:"value"`
	Samples int    `json:"samples"`
}

// top returns at most k keys sampled over limit within window, most frequent first.
func (s *overLimitSample) top(k int, window time.Duration) []TopKey {
	cutoff := time.Now().Add(-window)
	counts := map[overLimitKey]int{}
	s.mu.Lock()
	for _, e := range s.ring {
		if !e.At.IsZero() && e.At.After(cutoff) {
			counts[overLimitKey{Domain: e.Domain, Rule: e.Rule, Value: e.Value}]++
		}
	}
	s.mu.Unlock()
	out := make([]TopKey, 0, len(counts))
	for key, n := range counts {
		out = append(out, TopKey{key.Domain, key.Rule, key.Value, n})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Samples != out[j].Samples {
			return out[i].Samples > out[j].Samples
		}
		return out[i].Rule+out[i].Value < out[j].Rule+out[j].Value
	})
	if len(out) > k {
		out = out[:k]
	}
	return out
}
