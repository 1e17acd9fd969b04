package controller

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/demand/consulkv"
)

// A model of one service's demand sharing under faults, without Consul: n
// controllers over one rule of 400/s shared by demand, a map standing for the
// reports folder (each key with the index of its last write), the first
// controller dividing. Each replica's report can be written, overwritten with
// garbage, deleted with its session, or left behind by a previous process
// of the same node; then the leader divides one snapshot, every replica
// applies the same parameters, and the shares in force must sum to at most
// L.

// kvEntry is one key of the modelled reports folder.
type kvEntry struct {
	value []byte
	index uint64
}

// faultCluster is the model. Not safe for concurrent use.
type faultCluster struct {
	t    *testing.T
	reps []*demandRig
	kv   map[string]kvEntry
	idx  uint64
	now  time.Time
	seq  uint64
}

const faultLimit = 400

// newFaultRig is a controller of node on a service of total replicas of
// weight 1.
func newFaultRig(t *testing.T, node string, total int, now time.Time) *demandRig {
	t.Helper()
	return newRig(t, fmt.Sprintf("domain: a\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: %d, share: demand}\n", faultLimit),
		node, total, 0, now)
}

func newFaultCluster(t *testing.T, n int) *faultCluster {
	c := &faultCluster{t: t, kv: map[string]kvEntry{}, now: time.Unix(1_000_000, 0)}
	for i := range n {
		c.reps = append(c.reps, newFaultRig(t, c.node(i), n, c.now))
	}
	return c
}

func (c *faultCluster) node(i int) string { return fmt.Sprintf("n%d", i+1) }

// report is replica i's report wanting offered, encoded.
func (c *faultCluster) report(i int, offered float64) []byte {
	c.seq++
	rep := demand.Report{Seq: c.seq, At: c.now.UnixNano(), Units: 1, Node: c.node(i),
		Rules: []demand.RuleDemand{{ID: demand.RuleIDOf(c.reps[i].rule.Identity), Offered: offered}}}
	b, err := demand.AppendReport(nil, &rep)
	if err != nil {
		c.t.Fatal(err)
	}
	return b
}

// write is replica i writing its report: the key holds it, and the replica
// records it at the write's index.
func (c *faultCluster) write(i int, offered float64) {
	b := c.report(i, offered)
	c.idx++
	c.kv[c.node(i)] = kvEntry{b, c.idx}
	dec, err := demand.DecodeReport(b)
	if err != nil {
		c.t.Fatal(err)
	}
	r := c.reps[i].d
	r.mu.Lock()
	r.hist.Add(c.idx, dec)
	r.mu.Unlock()
}

// garbage overwrites replica i's key with bytes that do not decode.
func (c *faultCluster) garbage(i int) {
	c.idx++
	c.kv[c.node(i)] = kvEntry{[]byte("garbage"), c.idx}
}

// destroy ends replica i's session behind its back: the key goes, and the
// replica has not noticed yet.
func (c *faultCluster) destroy(i int) { delete(c.kv, c.node(i)) }

// restart replaces replica i with a new process of the same node, which
// remembers nothing: the old process's report stays in the folder, held by
// its session, until something replaces or removes it.
func (c *faultCluster) restart(i int) {
	c.reps[i] = newFaultRig(c.t, c.node(i), len(c.reps), c.now)
}

// snapshot is the folder as the leader reads it now.
func (c *faultCluster) snapshot() consulkv.Snapshot {
	s := consulkv.Snapshot{Index: c.idx}
	for _, node := range slices.Sorted(maps.Keys(c.kv)) {
		e := c.kv[node]
		s.Reports = append(s.Reports, consulkv.KVReport{Node: node, Value: e.value, ModifyIndex: e.index, Session: "s-" + node})
	}
	return s
}

// divide has the first replica divide snap.
func (c *faultCluster) divide(snap consulkv.Snapshot) []byte {
	b, err := c.reps[0].d.divide(snap)
	if err != nil {
		c.t.Fatal(err)
	}
	return b
}

// deliver hands params to every replica and lets grows apply; it returns
// the sum of the shares in force, as fractions of L.
func (c *faultCluster) deliver(params []byte) (sum float64, shares []float64) {
	c.idx++
	for _, r := range c.reps {
		r.now = c.now
		r.d.onParams(params, c.idx)
	}
	c.now = c.now.Add(c.reps[0].d.growDelay())
	for _, r := range c.reps {
		r.tick(c.now.Sub(r.now))
		shares = append(shares, r.weight())
		sum += r.weight()
	}
	return sum, shares
}

// TestDemandFaultsNeverLooser: each fault of one replica's report (garbage
// in its key, its session destroyed, a restart that finds the previous
// process's report still held) leaves the shares of one division summing to
// at most L, and the replica whose report the division did not count at
// most its equal share.
func TestDemandFaultsNeverLooser(t *testing.T) {
	const hot, cold = 1000, 10
	for _, tc := range []struct {
		name string
		// fault acts on replica 0 after every replica wrote its demand;
		// then the leader divides.
		fault      func(c *faultCluster)
		demands    []float64
		faultyMost float64 // the most replica 0 may take
	}{
		{"garbage in its report key", func(c *faultCluster) { c.garbage(0) }, []float64{hot, cold, cold, cold}, 0.25},
		{"its session destroyed, its report with it", func(c *faultCluster) { c.destroy(0) }, []float64{hot, cold, cold, cold}, 0.25},
		{"restarted while its old session holds a low report", func(c *faultCluster) {
			// The previous process wanted little; the new one wants a
			// lot, and its write is refused (the key is locked).
			c.write(0, cold)
			c.restart(0)
		}, []float64{cold, hot, cold, cold}, 0.25},
		{"no fault", func(*faultCluster) {}, []float64{hot, cold, cold, cold}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newFaultCluster(t, len(tc.demands))
			for i, d := range tc.demands {
				c.write(i, d)
			}
			tc.fault(c)
			sum, shares := c.deliver(c.divide(c.snapshot()))
			t.Logf("shares in force %.4f, sum %.4f of L", shares, sum)
			if sum > 1+1e-9 {
				t.Errorf("the shares of one division sum to %.4f of L", sum)
			}
			if shares[0] > tc.faultyMost+1e-12 {
				t.Errorf("the replica whose report was not counted takes %.4f, more than its equal share %.2f", shares[0], tc.faultyMost)
			}
		})
	}
}

// TestDemandDivisionSumsToAtMostL is the property over random faults: n
// replicas, each with a random demand and a random fate for its report; the
// leader divides one snapshot; every replica applies the parameters; their
// shares in force sum to at most L.
func TestDemandDivisionSumsToAtMostL(t *testing.T) {
	fates := []string{"written", "garbage", "missing", "destroyed", "stale after restart", "restarted and written",
		"written after the snapshot", "failed write", "failed write that landed", "never wrote", "many writes since"}
	seen := map[string]int{}
	rng := rand.New(rand.NewPCG(30, 3))
	worst := 0.0
	for iter := range 300 {
		n := 2 + rng.IntN(7)
		c := newFaultCluster(t, n)
		demandOf := func() float64 {
			switch rng.IntN(4) {
			case 0:
				return 0
			case 1:
				return rng.Float64() * faultLimit / float64(n)
			default:
				return rng.Float64() * 2 * faultLimit
			}
		}
		fate := make([]string, n)
		for i := range n {
			fate[i] = fates[rng.IntN(len(fates))]
			seen[fate[i]]++
			switch fate[i] {
			case "never wrote":
			case "missing":
				c.write(i, demandOf())
				delete(c.kv, c.node(i))
				c.reps[i].d.mu.Lock()
				c.reps[i].d.hist.Reset() // it knows: its session went
				c.reps[i].d.mu.Unlock()
			default:
				c.write(i, demandOf())
			}
		}
		for i := range n {
			switch fate[i] {
			case "garbage":
				c.garbage(i)
			case "destroyed":
				c.destroy(i)
			case "stale after restart":
				c.restart(i)
			case "restarted and written":
				c.restart(i)
				c.write(i, demandOf())
			case "failed write":
				// An error on the way back: the replica records nothing,
				// and nothing was written.
			case "failed write that landed":
				// An error on the way back, but Consul applied it.
				c.idx++
				c.kv[c.node(i)] = kvEntry{c.report(i, demandOf()), c.idx}
			}
		}
		snap := c.snapshot()
		for i := range n {
			switch fate[i] {
			case "written after the snapshot":
				c.write(i, demandOf())
			case "many writes since":
				for range demand.HistoryLen + 1 {
					c.write(i, demandOf())
				}
			}
		}
		sum, shares := c.deliver(c.divide(snap))
		worst = max(worst, sum)
		if sum > 1+1e-9 {
			t.Fatalf("iteration %d: %d replicas with fates %q: shares %.4f sum to %.4f of L", iter, n, fate, shares, sum)
		}
	}
	t.Logf("worst sum %.6f of L; fates drawn %v", worst, seen)
	if len(seen) != len(fates) {
		t.Fatalf("fates drawn %v: not every fate was tried", seen)
	}
}
