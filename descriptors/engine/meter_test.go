package engine

import (
	"math"
	"testing"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// TestMeterReported: what RLQS clients report for a bucket counts in the
// demand meters Decide's own draws count in: the rule's, and a per-value
// rule's candidates (then its hot value's once the value is hot). Rules not
// shared by demand, unknown ids and a stale share count nothing.
func TestMeterReported(t *testing.T) {
	e := newEngine(t, demandSet(t, ""), bucket.NewStore(0), Options{Weight: 0.5})
	hot := e.BucketShare("a", map[string]string{"hot": "x"})
	e.MeterReported(hot, 120, 80)
	if off, adm := demandOf(t, e, "a.hot_x").Counts(); off != 120 || adm != 80 {
		t.Errorf("share: demand rule counted %d offered, %d admitted; want 120, 80", off, adm)
	}
	e.MeterReported(hot, 10, 20) // admitted never above offered
	if off, adm := demandOf(t, e, "a.hot_x").Counts(); off != 130 || adm != 90 {
		t.Errorf("after a report admitting more than offered: %d, %d; want 130, 90", off, adm)
	}
	e.MeterReported(e.BucketShare("a", map[string]string{"fixed": "x"}), 50, 50)
	e.MeterReported(e.BucketShare("a", map[string]string{"nothing": "x"}), 50, 50)
	if d := demandOf(t, e, "a.fixed_x"); d != nil {
		t.Fatalf("a rule not shared by demand has a meter")
	}

	all := newEngine(t, demandSet(t, ""), bucket.NewStore(0), Options{Weight: 0.5, DemandAll: true})
	client := all.BucketShare("a", map[string]string{"client": "c1"})
	all.MeterReported(client, 40, 30)
	d := demandOf(t, all, "a.client")
	if off, adm := d.Counts(); off != 40 || adm != 30 {
		t.Errorf("per-value rule counted %d, %d; want 40, 30", off, adm)
	}
	id := ValueID(d.RuleID(), client.Rule, client.Entries)
	if got := d.Candidates()[id]; got != 40 {
		t.Errorf("the reported value is a candidate with %d tokens, want 40 (candidates %v)", got, d.Candidates())
	}
	hv := all.SetHot(d, []uint64{id}, 0)
	if len(hv) != 1 {
		t.Fatalf("SetHot gave %d hot values", len(hv))
	}
	all.MeterReported(all.BucketShare("a", map[string]string{"client": "c1"}), 7, 5)
	if off, adm := hv[0].Counts(); off != 7 || adm != 5 {
		t.Errorf("hot value counted %d, %d; want 7, 5", off, adm)
	}

	// A share resolved against a set since replaced counts nothing: its
	// rule may be another's now.
	stale := all.BucketShare("a", map[string]string{"client": "c2"})
	all.Swap(demandSet(t, ""))
	before, _ := demandOf(t, all, "a.client").Counts()
	all.MeterReported(stale, 100, 100)
	if after, _ := demandOf(t, all, "a.client").Counts(); after != before {
		t.Errorf("a stale share was counted: %d → %d", before, after)
	}
}

// A report of counts near 2^64 counts at most MaxReported: the meters are
// cumulative, and two such reports would wrap them (read as a meter that
// restarted) or, once, drown every other replica's demand.
func TestMeterReportedIsClamped(t *testing.T) {
	e := newEngine(t, demandSet(t, ""), bucket.NewStore(0), Options{Weight: 0.5})
	hot := e.BucketShare("a", map[string]string{"hot": "x"})
	d := demandOf(t, e, "a.hot_x")
	var prev uint64
	for i := range 3 {
		e.MeterReported(hot, math.MaxUint64, math.MaxUint64)
		off, adm := d.Counts()
		if off < prev || adm > off || off > uint64(i+1)*1e9 {
			t.Fatalf("after %d reports of 2^64-1: %d offered, %d admitted (before %d offered)", i+1, off, adm, prev)
		}
		prev = off
	}
}
