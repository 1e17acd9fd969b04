package controller

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/demand/consulkv"
	"github.com/sharelimit/sharelimit/membership"
)

// Fakes for the policy tests: a clock that moves when the test says, an
// engine that is a table of weights and meters, and a store standing for
// Consul KV whose faults the test produces on demand.

// fakeClock is wall and engine time, moved by the test alone.
type fakeClock struct {
	mu   sync.Mutex
	wall time.Time
	mono int64
}

func newFakeClock() *fakeClock { return &fakeClock{wall: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.wall
}

func (c *fakeClock) Mono() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.mono
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.wall = c.wall.Add(d)
	c.mono += int64(d)
}

// fakeEngine is an Engine over a fixed list of rules. Safe for concurrent
// use, as the controller needs.
type fakeEngine struct {
	mu      sync.Mutex
	rules   []Rule
	weights map[int]float64
	free    map[string][]int // a per-value rule's free slot groups
	cands   map[string]map[uint64]uint64
	setHots int // SetHot calls
}

var _ Engine = (*fakeEngine)(nil)

// newFakeEngine holds rules at the equal share equal, in domain group 1;
// a per-value rule gets 2·topKeys slots.
func newFakeEngine(equal float64, rules ...Rule) *fakeEngine {
	e := &fakeEngine{weights: map[int]float64{1: equal}, free: map[string][]int{}, cands: map[string]map[uint64]uint64{}}
	next := 2
	for _, r := range rules {
		r.DomainGroup = 1
		if r.PerValue {
			r.Group = 1
			for range r.Slots {
				e.free[r.Identity] = append(e.free[r.Identity], next)
				e.weights[next] = equal
				next++
			}
		} else {
			r.Group = next
			e.weights[next] = equal
			next++
		}
		e.rules = append(e.rules, r)
	}
	return e
}

func (e *fakeEngine) Rules(domainGroup int) []Rule {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []Rule
	for _, r := range e.rules {
		if r.DomainGroup == domainGroup {
			r.Hot = slices.Clone(r.Hot)
			out = append(out, r)
		}
	}
	return out
}

func (e *fakeEngine) Candidates(identity string) (map[uint64]uint64, float64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	c := e.cands[identity]
	delete(e.cands, identity)
	return c, 16
}

func (e *fakeEngine) Weight(g int) float64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.weights[g]
}

func (e *fakeEngine) SetWeight(g int, w float64, _ int64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if w > 0 && w <= 1 {
		e.weights[g] = w
	}
}

func (e *fakeEngine) SetHot(identity string, ids []uint64, _ int64) []Hot {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.setHots++
	r := e.rule(identity)
	want := map[uint64]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var next []Hot
	for _, hv := range r.Hot {
		if want[hv.ID] && len(next) < r.Slots {
			next = append(next, hv)
			delete(want, hv.ID)
			continue
		}
		e.free[identity] = append(e.free[identity], hv.Group)
	}
	for _, id := range ids {
		if !want[id] || len(e.free[identity]) == 0 {
			continue
		}
		g := e.free[identity][0]
		e.free[identity] = e.free[identity][1:]
		e.weights[g] = e.weights[r.DomainGroup]
		next = append(next, Hot{ID: id, Group: g})
	}
	r.Hot = next
	return slices.Clone(next)
}

// rule is the rule of identity. Called with mu held.
func (e *fakeEngine) rule(identity string) *Rule {
	for i := range e.rules {
		if e.rules[i].Identity == identity {
			return &e.rules[i]
		}
	}
	panic("no rule " + identity)
}

// meter adds tokens asked for and given to rule identity's meter, or, with
// a value, to that hot value's.
func (e *fakeEngine) meter(identity string, value uint64, offered, admitted uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	r := e.rule(identity)
	r.Offered += offered
	r.Admitted += admitted
	for i := range r.Hot {
		if r.Hot[i].ID == value {
			r.Hot[i].Offered += offered
			r.Hot[i].Admitted += admitted
			return
		}
	}
	if r.PerValue {
		if e.cands[identity] == nil {
			e.cands[identity] = map[uint64]uint64{}
		}
		e.cands[identity][value] += offered / 16
	}
}

// fakeKV is the reports folder of one service: each node's key, with the
// index of its last write.
type fakeKV struct {
	mu      sync.Mutex
	index   uint64
	reports map[string]kvEntry
}

func newFakeKV() *fakeKV { return &fakeKV{reports: map[string]kvEntry{}} }

// put writes node's key; it returns the write's index.
func (kv *fakeKV) put(node string, value []byte) uint64 {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	kv.index++
	kv.reports[node] = kvEntry{value, kv.index}
	return kv.index
}

func (kv *fakeKV) drop(node string) {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	delete(kv.reports, node)
}

// snapshot is the folder as the leader reads it now.
func (kv *fakeKV) snapshot() consulkv.Snapshot {
	kv.mu.Lock()
	defer kv.mu.Unlock()
	s := consulkv.Snapshot{Index: kv.index}
	for _, node := range slices.Sorted(maps.Keys(kv.reports)) {
		e := kv.reports[node]
		s.Reports = append(s.Reports, consulkv.KVReport{Node: node, Value: e.value, ModifyIndex: e.index, Session: "s-" + node})
	}
	return s
}

// fakeStore is one replica's store on a fakeKV. Its faults: the next
// write fails (fail), perhaps after landing (lost: Consul applied it, the
// answer was lost); the session expires (expire), its report with it; the
// session goes unrenewed (renewed stands still).
type fakeStore struct {
	mu      sync.Mutex
	kv      *fakeKV
	node    string
	clock   *fakeClock
	gen     uint64
	renewed time.Time // zero: renewed just now, always
	leading bool
	fail    error
	lost    bool
	// adopt is handed over by Adopted once, after a write: a previous
	// process's report taken over.
	adopt *kvEntry
}

var _ store = (*fakeStore)(nil)

func (s *fakeStore) Publish(_ context.Context, value []byte) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		if s.lost {
			s.kv.put(s.node, value)
		}
		return 0, s.fail
	}
	return s.kv.put(s.node, value), nil
}

func (s *fakeStore) Session() (uint64, time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.renewed.IsZero() {
		return s.gen, s.clock.Now()
	}
	return s.gen, s.renewed
}

func (s *fakeStore) Adopted() ([]byte, uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.adopt == nil {
		return nil, 0, false
	}
	e := s.adopt
	s.adopt = nil
	return e.value, e.index, true
}

func (s *fakeStore) Leading() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leading
}

// expire ends the session behind the replica's back: its key goes, and
// the next session is another.
func (s *fakeStore) expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.kv.drop(s.node)
	s.gen++
}

// replica is one controller on the fakes.
type replica struct {
	node  string
	eng   *fakeEngine
	st    *fakeStore
	c     *Controller
	mu    sync.Mutex
	view  membership.View
	clock *fakeClock
}

// newReplica is node's controller of rules on a service of total replicas
// of weight 1, writing to kv, on clock.
func newReplica(t *testing.T, node string, total int, kv *fakeKV, clock *fakeClock, rules ...Rule) *replica {
	t.Helper()
	equal := 1 / float64(total)
	r := &replica{node: node, eng: newFakeEngine(equal, rules...), clock: clock,
		view: membership.View{Source: "consul", Node: node, Total: total, Local: 1, TotalWeight: total, LocalWeight: 1, Weight: equal}}
	r.st = &fakeStore{kv: kv, node: node, clock: clock, gen: 1}
	r.c = New(r.eng, nil, Config{Service: "web", Group: 1, Prefix: "p/", Interval: time.Second, MaxWrites: 100, QueryRate: 2,
		Node: node, TopKeys: 2, View: r.membership, Clock: clock.Mono})
	r.c.wall = clock.Now
	r.c.attach(node, r.st)
	return r
}

func (r *replica) membership() membership.View {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.view
}

// setView puts mv in force, as the daemon's view does.
func (r *replica) setView(mv membership.View) {
	r.mu.Lock()
	r.view = mv
	r.mu.Unlock()
	r.eng.SetWeight(1, mv.Weight, 0)
	r.c.ViewChanged()
}

// weight is the weight in force of rule identity's group.
func (r *replica) weight(identity string) float64 {
	for _, rule := range r.eng.Rules(1) {
		if rule.Identity == identity {
			return r.eng.Weight(rule.Group)
		}
	}
	panic("no rule " + identity)
}

// params is what r, leading, divides from kv now, encoded.
func (r *replica) params(t *testing.T, kv *fakeKV) []byte {
	t.Helper()
	b, err := r.c.divide(kv.snapshot())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// standing is how the parameters in force counted r's report.
func (r *replica) standing() demand.Standing {
	r.c.mu.Lock()
	defer r.c.mu.Unlock()
	return r.c.standing
}
