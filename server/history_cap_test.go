package server

import (
	"fmt"
	"testing"
	"time"
)

// capRules returns n sampled rules, each with its own series.
func capRules(n int) []sampled {
	out := make([]sampled, n)
	for i := range out {
		out[i] = sampled{key: ruleKey{"d", fmt.Sprintf("d.k%05d", i)}, unit: "second", series: testSeries(), share: 0.5}
	}
	return out
}

// A reload that swaps one rule for another while exactly maxHistoryRules
// are in force: the page then says a rule has no history although no more
// than the cap are in force.
func TestHistoryReloadAtCapCountsUntracked(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	h := newHistory(now)
	in := capRules(maxHistoryRules)
	now = now.Add(HistoryStep)
	h.sample(now, in)
	// The reload: the first rule goes, a new one comes; still 2000 rules.
	in = append(in[1:], sampled{key: ruleKey{"d", "d.new"}, unit: "second", series: testSeries(), share: 0.5})
	now = now.Add(HistoryStep)
	h.sample(now, in)
	if got := h.at(now, in, nil); got.Untracked != 0 || len(got.Rules) != maxHistoryRules {
		t.Errorf("%d rules in force (the cap is %d): %d reported untracked, %d with history; want 0 and %d",
			len(in), maxHistoryRules, got.Untracked, len(got.Rules), maxHistoryRules)
	}
}

// A rule past the cap has no ring while its counters run. When room frees
// up, its first slot is filled with everything its counters ever counted,
// not the last 10 s: a spike that dwarfs every other slot.
func TestHistoryLateRingSpike(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	h := newHistory(now)
	in := capRules(maxHistoryRules + 1)
	late := in[maxHistoryRules]
	for range 30 { // five minutes at 100 requests a slot
		late.series.ok.Add(100)
		now = now.Add(HistoryStep)
		h.sample(now, in)
	}
	// A reload drops one rule: room for the late one.
	in = in[1:]
	for range 2 {
		late.series.ok.Add(100)
		now = now.Add(HistoryStep)
		h.sample(now, in)
	}
	got := h.at(now, in, nil)
	for _, rh := range got.Rules {
		if rh.Rule != late.key.path {
			continue
		}
		for i := rh.From; i < len(rh.Admitted)-1; i++ {
			if rh.Admitted[i] > 100 {
				t.Errorf("slot %d of %s: %d admitted in 10 s; the rule admitted 100 a slot (its counter's whole total went into one slot)", i, rh.Rule, rh.Admitted[i])
			}
		}
		return
	}
	t.Fatalf("%s has no history after room freed up", late.key.path)
}

// The same spike in the slot in progress: a rule the cap kept out shows,
// once room frees up but before the next sample, its counter's whole total
// as the current 10 s.
func TestHistoryLateRingSpikeInProgress(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	h := newHistory(now)
	in := capRules(maxHistoryRules + 1)
	late := in[maxHistoryRules]
	for range 30 {
		late.series.ok.Add(100)
		now = now.Add(HistoryStep)
		h.sample(now, in)
	}
	in = in[1:]
	now = now.Add(HistoryStep)
	h.sample(now, in) // the late rule is still kept out: the departed ring was still counted
	late.series.ok.Add(7)
	got := h.at(now.Add(time.Second), in, nil)
	for _, rh := range got.Rules {
		if rh.Rule == late.key.path {
			if n := rh.Admitted[len(rh.Admitted)-1]; n > 107 {
				t.Errorf("slot in progress of %s: %d admitted, want at most the 107 since the last sample", rh.Rule, n)
			}
			return
		}
	}
	t.Logf("%s not shown", late.key.path)
}
