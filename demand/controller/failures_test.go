package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/demand/consulkv"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// TestCauseLog: a failure warns when it starts and when its cause changes,
// not while it repeats; its end is told when its start was; the same cause
// coming back within minRewarn stays quiet, later it warns again.
func TestCauseLog(t *testing.T) {
	var c causeLog
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at    time.Duration
		fail  string // "" for a success
		warn  bool
		ended string
	}{
		{0, "held", true, ""},
		{time.Second, "held", false, ""},
		{2 * time.Second, "denied", true, ""},
		{3 * time.Second, "", false, "denied"},
		{4 * time.Second, "", false, ""},
		{5 * time.Second, "denied", false, ""}, // back within a minute: quiet
		{6 * time.Second, "", false, ""},       // and so is its end
		{5*time.Second + minRewarn, "denied", true, ""},
		{6*time.Second + minRewarn, "unreachable", true, ""},
		{7*time.Second + minRewarn, "", false, "unreachable"},
	}
	for i, s := range steps {
		now := t0.Add(s.at)
		if s.fail != "" {
			if got := c.fail("", s.fail, now); got != s.warn {
				t.Errorf("step %d (%s at %v): warn %v, want %v", i, s.fail, s.at, got, s.warn)
			}
			continue
		}
		if got := c.ok(""); got != s.ended {
			t.Errorf("step %d (ok at %v): ended %q, want %q", i, s.at, got, s.ended)
		}
	}
	c.forget(t0.Add(time.Hour))
	if len(c.last) != 0 {
		t.Errorf("forget kept %v", c.last)
	}
}

func TestWriteCause(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: k: held by session x", consulkv.ErrHeld), writeHeld},
		{fmt.Errorf("%w: k: session x", consulkv.ErrSessionGone), writeSessionGone},
		{fmt.Errorf("write k: %w", api.StatusError{Code: 403, Body: "Permission denied"}), writeDenied},
		{fmt.Errorf("write k: %w", context.DeadlineExceeded), writeUnreachable},
		{fmt.Errorf("write k: %w", &net.OpError{Op: "dial", Err: errors.New("connection refused")}), writeUnreachable},
		{errors.New("Unexpected response code: 500 (something)"), writeOther},
	} {
		if got := writeCause(tc.err); got != tc.want {
			t.Errorf("%v: %q, want %q", tc.err, got, tc.want)
		}
	}
}

// TestLeaderTellsOfUnusableReports: the leader counts each report it
// cannot use per division and cause, lists it for the admin pages, warns
// once per node and cause however many divisions find it, and tells when
// it is usable again. None of them is listed as counted.
func TestLeaderTellsOfUnusableReports(t *testing.T) {
	c := newFaultCluster(t, 4)
	logs := &testutil.Buffer{}
	leader := c.reps[0]
	leader.d.log = slog.New(slog.NewTextHandler(logs, nil))
	for i := range 4 {
		c.write(i, 100)
	}
	other := c.report(3, 100) // n4's report, written under n3's key below
	var snap consulkv.Snapshot
	divide := func() demand.Params {
		t.Helper()
		c.garbage(1)
		c.idx++
		c.kv["n3"] = kvEntry{other, c.idx}
		snap = c.snapshot()
		snap.Reports = append(snap.Reports, consulkv.KVReport{Node: "n5", ModifyIndex: c.idx, Oversized: true})
		p, err := demand.DecodeParams(c.divide(snap))
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	for range 5 {
		p := divide()
		if len(p.Reports) != 2 {
			t.Fatalf("reports counted %v, want n1's and n4's alone", p.Reports)
		}
	}
	d := leader.d
	d.mu.Lock()
	counts := fmt.Sprint(d.badReps)
	bad := fmt.Sprint(d.bad)
	d.mu.Unlock()
	if counts != "map[oversized:5 undecodable:5 wrong_node:5]" {
		t.Errorf("unusable reports counted %s", counts)
	}
	for _, want := range []string{"n2 undecodable", "n3 wrong_node the report names node n4", "n5 oversized"} {
		if !strings.Contains(bad, want) {
			t.Errorf("the last division's unusable reports %s lack %q", bad, want)
		}
	}
	warned := strings.Count(logs.String(), `level=WARN msg="demand report unusable`)
	if warned != 3 {
		t.Errorf("%d warnings over five divisions of three unusable reports, want 3:\n%s", warned, logs)
	}
	// n2 writes a good report: the leader says so, once.
	c.write(1, 100)
	if _, err := d.divide(c.snapshot()); err != nil {
		t.Fatal(err)
	}
	if _, err := d.divide(c.snapshot()); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(logs.String(), `msg="demand report usable again" service=web node=n2 after=undecodable`); got != 1 {
		t.Errorf("n2 usable again told %d times, want once:\n%s", got, logs)
	}
}
