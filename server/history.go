package server

import (
	"context"
	"encoding/json"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// The status page answers the first question of an incident, "are we
// rejecting, since when, and on which share?", with the last ten minutes of
// each rule. The history keeps them: one ring per rule of 10 s slots, filled
// by a sampler off the request path that reads the per-rule counters the
// decisions already increment. The request path pays nothing for it.
const (
	// HistoryStep is the width of a slot: how often the sampler runs.
	HistoryStep  = 10 * time.Second
	historySlots = 60 // ten minutes of HistoryStep
	// maxHistoryRules bounds the rules kept, so memory stays bounded with
	// any config (about 2.5 KiB a rule, 5 MB in all); past it, rules have no history and
	// the page says so.
	maxHistoryRules = 2000
	maxMarks        = 64
)

// Mark kinds: a moment worth a line on the sparklines.
const (
	MarkReload     = "reload"     // a config was put in force
	MarkMembership = "membership" // a membership view changed this replica's weight
	// MarkShare is drawn where a rule's share differs from the slot
	// before (membership or demand): the slots' shares say it, per rule.
	MarkShare = "share"
)

// Mark is an event on the history's time line, for every rule.
type Mark struct {
	At   time.Time `json:"at"`
	Kind string    `json:"kind"`
	Note string    `json:"note,omitempty"`
}

// slot is one HistoryStep of a rule.
type slot struct {
	seq                    uint64 // the sample that filled it; 0: never filled
	admitted, over, shadow uint64
	share                  float64
}

// ruleRing is one rule's last historySlots slots.
type ruleRing struct {
	key  ruleKey
	unit string
	// series is the series last read. Another one means the rule's counters
	// started again (it was dropped by a reload and came back), so base is 0.
	series *ruleSeries
	base   [3]uint64 // the counters at the last sample
	slots  [historySlots]slot
	seen   uint64 // the last sample that found the rule
}

// history is every rule's ring and the marks. Safe for concurrent use; the
// zero value is not usable: newHistory.
type history struct {
	mu    sync.Mutex
	seq   uint64                  // samples taken
	ends  [historySlots]time.Time // when each slot's sample was taken, by seq % historySlots
	start time.Time               // when the slot in progress began
	rules map[ruleKey]*ruleRing
	// untracked counts the rules in force at the last sample that have no
	// ring because maxHistoryRules were kept already; unseen names them: a
	// ring they get later starts from their counters as they are then, not
	// from zero, or its first slot would hold everything counted unseen.
	untracked int
	unseen    map[ruleKey]bool
	marks     [maxMarks]Mark
	nmarks    int
}

func newHistory(now time.Time) *history {
	return &history{rules: map[ruleKey]*ruleRing{}, start: now}
}

// sampled is what the sampler reads of one rule in force.
type sampled struct {
	key    ruleKey
	unit   string
	series *ruleSeries // nil: the rule has no series (never bound)
	share  float64
}

// sample closes the slot in progress at now with the counts since the last
// sample, for each rule in rules; a rule not among them loses its ring.
func (h *history) sample(now time.Time, rules []sampled) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seq++
	h.ends[h.seq%historySlots] = now
	// Rules gone since the last sample give their places up first, so that
	// a reload swapping rules at the cap keeps every rule in force tracked.
	for _, r := range rules {
		if ring := h.rules[r.key]; ring != nil {
			ring.seen = h.seq
		}
	}
	for k, ring := range h.rules {
		if ring.seen != h.seq {
			delete(h.rules, k)
		}
	}
	wasUnseen := h.unseen
	h.untracked, h.unseen = 0, nil
	for _, r := range rules {
		ring := h.rules[r.key]
		if ring == nil {
			if len(h.rules) >= maxHistoryRules {
				h.untracked++
				if h.unseen == nil {
					h.unseen = map[ruleKey]bool{}
				}
				h.unseen[r.key] = true
				continue
			}
			ring = &ruleRing{key: r.key}
			h.rules[r.key] = ring
			if wasUnseen[r.key] {
				// Counted unseen until now: this interval's share of that is
				// unknown, so its slot stays empty and counting starts here.
				ring.unit, ring.seen = r.unit, h.seq
				ring.base = ring.read(r.series)
				continue
			}
		}
		ring.unit = r.unit
		cur := ring.read(r.series)
		s := &ring.slots[h.seq%historySlots]
		*s = slot{seq: h.seq, admitted: cur[0] - ring.base[0], over: cur[1] - ring.base[1], shadow: cur[2] - ring.base[2], share: r.share}
		ring.base, ring.seen = cur, h.seq
	}
	h.start = now
}

// read returns the series' counters, and makes s the ring's series: a new
// series starts from zero, so its whole count is new.
func (r *ruleRing) read(s *ruleSeries) [3]uint64 {
	if s != r.series {
		r.series, r.base = s, [3]uint64{}
	}
	if s == nil {
		return [3]uint64{}
	}
	cur := [3]uint64{counterValue(s.ok), counterValue(s.over), counterValue(s.shadow)}
	for i := range cur {
		// A counter never goes back; if one seems to, start again from it
		// rather than show a wrapped-around delta.
		if cur[i] < r.base[i] {
			r.base[i] = 0
		}
	}
	return cur
}

func counterValue(c prometheus.Counter) uint64 {
	var m dto.Metric
	if c.Write(&m) != nil {
		return 0
	}
	return uint64(m.GetCounter().GetValue())
}

// mark records an event; the oldest goes once maxMarks are kept. Callers
// hold mu.
func (h *history) mark(m Mark) {
	h.marks[h.nmarks%maxMarks] = m
	h.nmarks++
}

// Mark records an event on the sparklines: a reload, or a membership change.
func (a *Admin) Mark(kind, note string) {
	a.history.mu.Lock()
	a.history.mark(Mark{At: time.Now(), Kind: kind, Note: note})
	a.history.mu.Unlock()
}

// RunHistory samples the per-rule counters into the history on every tick
// (every HistoryStep in the daemon) until ctx ends.
func (a *Admin) RunHistory(ctx context.Context, tick <-chan time.Time) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick:
			a.sampleHistory(now)
		}
	}
}

// sampleHistory closes the slot in progress with the rules in force and
// their shares now.
func (a *Admin) sampleHistory(now time.Time) {
	a.history.sample(now, a.sampleRules())
}

// sampleRules lists the rules in force with their series and shares.
func (a *Admin) sampleRules() []sampled {
	rules := a.engine.Set().Rules()
	out := make([]sampled, 0, len(rules))
	a.metrics.mu.Lock()
	defer a.metrics.mu.Unlock()
	for _, r := range rules {
		lim := r.Limit()
		if lim == nil {
			continue
		}
		key := ruleKey{r.Domain(), r.Path()}
		s := sampled{key: key, series: a.metrics.rules[key]}
		if !lim.Unlimited() {
			s.share, s.unit = a.engine.RuleWeight(r).W, lim.Unit().String()
		}
		out = append(out, s)
	}
	return out
}

// History is the rings as /rlconfig/history serves them, for scripts: the
// slot times once, then each rule's counts per slot, oldest first. The last
// slot is the one in progress, Partial seconds long so far.
type History struct {
	StepSeconds float64 `json:"step_seconds"`
	// Starts are the slots' start times; the last is the slot in progress.
	Starts  []time.Time `json:"starts"`
	Partial float64     `json:"partial_seconds"` // how long the last slot has run
	// Untracked rules have no history: more than maxHistoryRules are in force.
	Untracked int           `json:"untracked_rules"`
	Marks     []Mark        `json:"marks"`
	Rules     []RuleHistory `json:"rules"`
}

// RuleHistory is one rule's slots, aligned with History.Starts. Slots
// before From were taken before the rule was in force, and are 0.
type RuleHistory struct {
	Domain   string    `json:"domain"`
	Rule     string    `json:"rule"`
	Unit     string    `json:"unit"`
	From     int       `json:"from"`
	Admitted []uint64  `json:"admitted"`
	Over     []uint64  `json:"over_limit"`
	Shadow   []uint64  `json:"shadow_over_limit"`
	Share    []float64 `json:"share"`
}

// historyAt is the history at now, with the slot in progress read from the
// counters as they are. Only rules for which want says yes are included
// (nil: every rule), in no particular order.
func (a *Admin) historyAt(now time.Time, want func(ruleKey) bool) History {
	return a.history.at(now, a.sampleRules(), want)
}

// at is the history at now of the rules in live, those in force.
func (h *history) at(now time.Time, live []sampled, want func(ruleKey) bool) History {
	h.mu.Lock()
	defer h.mu.Unlock()
	// The slots still in the window: the last historySlots samples, of
	// which the first seq may not have been taken yet.
	first := uint64(1)
	if h.seq >= historySlots {
		first = h.seq - historySlots + 1
	}
	out := History{StepSeconds: HistoryStep.Seconds(), Partial: max(now.Sub(h.start).Seconds(), 0), Untracked: h.untracked}
	if h.seq >= first {
		out.Starts = append(out.Starts, h.ends[first%historySlots].Add(-HistoryStep))
		for seq := first; seq < h.seq; seq++ {
			out.Starts = append(out.Starts, h.ends[seq%historySlots])
		}
	}
	out.Starts = append(out.Starts, h.start)
	n := len(out.Starts)
	fresh := 0 // rules in force since the last sample, shown with the slot in progress only
	for _, r := range live {
		ring := h.rules[r.key]
		if want != nil && !want(r.key) {
			continue
		}
		if ring == nil {
			if fresh++; len(h.rules)+fresh > maxHistoryRules || h.unseen[r.key] {
				// Past the cap, or counted unseen: what of its count falls
				// in the slot in progress is unknown.
				continue
			}
			ring = &ruleRing{key: r.key, unit: r.unit}
		}
		rh := RuleHistory{Domain: r.key.domain, Rule: r.key.path, Unit: ring.unit, From: n - 1,
			Admitted: make([]uint64, n), Over: make([]uint64, n), Shadow: make([]uint64, n), Share: make([]float64, n)}
		for i, seq := 0, first; seq <= h.seq; i, seq = i+1, seq+1 {
			s := ring.slots[seq%historySlots]
			if s.seq != seq {
				continue
			}
			rh.From = min(rh.From, i)
			rh.Admitted[i], rh.Over[i], rh.Shadow[i], rh.Share[i] = s.admitted, s.over, s.shadow, s.share
		}
		// The slot in progress: the counts since the last sample. Read
		// without moving the base, which only the sampler does.
		if r.series != nil {
			base := ring.base
			if ring.series != r.series {
				base = [3]uint64{} // a new series: all its count is new
			}
			cur := [3]uint64{counterValue(r.series.ok), counterValue(r.series.over), counterValue(r.series.shadow)}
			rh.Admitted[n-1], rh.Over[n-1], rh.Shadow[n-1] = sub(cur[0], base[0]), sub(cur[1], base[1]), sub(cur[2], base[2])
		}
		rh.Share[n-1] = r.share
		out.Rules = append(out.Rules, rh)
	}
	for i := max(0, h.nmarks-maxMarks); i < h.nmarks; i++ {
		m := h.marks[i%maxMarks]
		if !out.Starts[0].After(m.At) {
			out.Marks = append(out.Marks, m)
		}
	}
	return out
}

func sub(a, b uint64) uint64 {
	if a < b {
		return 0
	}
	return a - b
}

// historyJSON serves the rules' last ten minutes for scripts: the same
// rings the status page draws, every rule kept.
func (a *Admin) historyJSON(w http.ResponseWriter, _ *http.Request) {
	h := a.historyAt(time.Now(), nil)
	sort.Slice(h.Rules, func(i, j int) bool {
		if h.Rules[i].Domain != h.Rules[j].Domain {
			return h.Rules[i].Domain < h.Rules[j].Domain
		}
		return h.Rules[i].Rule < h.Rules[j].Rule
	})
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(h)
}
