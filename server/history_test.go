package server

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func testSeries() *ruleSeries {
	c := func() prometheus.Counter { return prometheus.NewCounter(prometheus.CounterOpts{Name: "x"}) }
	return &ruleSeries{ok: c(), over: c(), shadow: c()}
}

// TestHistoryModel drives the rings with random traffic, samples, rules that
// come and go (their counters start again when they come back) and share
// changes, and checks every view against a plain model: per rule, the list
// of every sample's counts.
func TestHistoryModel(t *testing.T) {
	t.Parallel()
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		t0 := time.Unix(1_000_000, 0)
		h := newHistory(t0)
		keys := []ruleKey{{"d", "d.a"}, {"d", "d.b"}, {"e", "e.c"}}
		type live struct {
			series *ruleSeries
			share  float64
			model  [][4]float64 // per sample since it came: admitted, over, shadow, share
			unsent [3]uint64    // counts since the last sample
		}
		rules := map[ruleKey]*live{}
		type goneRule struct {
			model [][4]float64
			at    uint64 // the sample count when it went
		}
		gone := map[ruleKey]goneRule{}
		var seq uint64
		now := t0
		for step := 0; step < 400; step++ {
			switch op := rng.IntN(10); {
			case op < 6: // traffic
				k := keys[rng.IntN(len(keys))]
				r := rules[k]
				if r == nil {
					continue
				}
				n := [3]uint64{uint64(rng.IntN(50)), uint64(rng.IntN(5)), uint64(rng.IntN(2))}
				r.series.ok.Add(float64(n[0]))
				r.series.over.Add(float64(n[1]))
				r.series.shadow.Add(float64(n[2]))
				for i := range n {
					r.unsent[i] += n[i]
				}
			case op < 8: // a sample, HistoryStep later
				now = now.Add(HistoryStep)
				var in []sampled
				seq++
				for _, k := range keys {
					if r := rules[k]; r != nil {
						in = append(in, sampled{key: k, unit: "second", series: r.series, share: r.share})
						r.model = append(r.model, [4]float64{float64(r.unsent[0]), float64(r.unsent[1]), float64(r.unsent[2]), r.share})
						r.unsent = [3]uint64{}
					}
				}
				h.sample(now, in)
			case op < 9: // a reload adds or drops a rule; one that comes back has new counters
				k := keys[rng.IntN(len(keys))]
				if rules[k] != nil {
					gone[k] = goneRule{rules[k].model, seq}
					delete(rules, k)
				} else {
					rules[k] = &live{series: testSeries(), share: 0.5}
					// Back before the next sample: the ring stays, with the
					// new series' counts from zero; the old series' counts
					// since the last sample are lost with it.
					if g, ok := gone[k]; ok && g.at == seq {
						rules[k].model = g.model
					}
				}
			default: // membership or demand moves the share
				for _, r := range rules {
					r.share = float64(1+rng.IntN(4)) / 4
				}
			}
			// Check the view, as the page and /rlconfig/history read it.
			var in []sampled
			for _, k := range keys {
				if r := rules[k]; r != nil {
					in = append(in, sampled{key: k, unit: "second", series: r.series, share: r.share})
				}
			}
			got := h.at(now.Add(3*time.Second), in, nil)
			n := len(got.Starts)
			if want := min(int(seq), historySlots) + 1; n != want {
				t.Fatalf("seed %d step %d: %d slots, want %d", seed, step, n, want)
			}
			if len(got.Rules) != len(in) {
				t.Fatalf("seed %d step %d: %d rules, want %d", seed, step, len(got.Rules), len(in))
			}
			for _, rh := range got.Rules {
				r := rules[ruleKey{rh.Domain, rh.Rule}]
				// The sampled slots: the model's last ones, right-aligned.
				for i := 0; i < n-1; i++ {
					back := n - 1 - i // samples ago, 1 = the last
					var want [4]float64
					if back <= len(r.model) {
						want = r.model[len(r.model)-back]
					}
					g := [4]float64{float64(rh.Admitted[i]), float64(rh.Over[i]), float64(rh.Shadow[i]), rh.Share[i]}
					if g != want {
						t.Fatalf("seed %d step %d: %s slot %d of %d: %v, want %v", seed, step, rh.Rule, i, n, g, want)
					}
				}
				if wantFrom := n - 1 - min(len(r.model), n-1); rh.From != wantFrom {
					t.Fatalf("seed %d step %d: %s from %d, want %d", seed, step, rh.Rule, rh.From, wantFrom)
				}
				last := [4]float64{float64(rh.Admitted[n-1]), float64(rh.Over[n-1]), float64(rh.Shadow[n-1]), rh.Share[n-1]}
				if want := [4]float64{float64(r.unsent[0]), float64(r.unsent[1]), float64(r.unsent[2]), r.share}; last != want {
					t.Fatalf("seed %d step %d: %s slot in progress %v, want %v", seed, step, rh.Rule, last, want)
				}
			}
			if len(h.rules) > len(keys) {
				t.Fatalf("%d rings for %d rules", len(h.rules), len(keys))
			}
		}
	}
}

// TestHistoryBounded: past maxHistoryRules rules, the rest have no ring and
// are counted, and the rings of rules gone are dropped.
func TestHistoryBounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_000_000, 0)
	h := newHistory(now)
	var in []sampled
	for i := range maxHistoryRules + 50 {
		in = append(in, sampled{key: ruleKey{"d", "d.k" + string(rune('a'+i%26)) + time.Duration(i).String()}, series: testSeries()})
	}
	for range 3 * historySlots {
		now = now.Add(HistoryStep)
		h.sample(now, in)
	}
	if len(h.rules) != maxHistoryRules || h.untracked != 50 {
		t.Fatalf("%d rings, %d untracked", len(h.rules), h.untracked)
	}
	if got := h.at(now, in, nil); len(got.Starts) != historySlots+1 || len(got.Rules) != maxHistoryRules || got.Untracked != 50 {
		t.Fatalf("%d slots, %d rules, %d untracked", len(got.Starts), len(got.Rules), got.Untracked)
	}
	h.sample(now.Add(HistoryStep), in[:10])
	if len(h.rules) != 10 || h.untracked != 0 {
		t.Fatalf("after a reload to 10 rules: %d rings, %d untracked", len(h.rules), h.untracked)
	}
	for i := range 3 * maxMarks {
		h.mark(Mark{At: now, Kind: MarkReload, Note: time.Duration(i).String()})
	}
	if got := h.at(now, in[:10], nil); len(got.Marks) != maxMarks || got.Marks[maxMarks-1].Note != time.Duration(3*maxMarks-1).String() {
		t.Fatalf("%d marks, last %+v", len(got.Marks), got.Marks[len(got.Marks)-1])
	}
}
