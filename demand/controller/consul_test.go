package controller

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/hashicorp/consul/api"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/demand/consulkv"
	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/internal/consultest"
	"github.com/sharelimit/sharelimit/internal/monotime"
	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/membership"
)

// Demand sharing's faults with real controllers on a real Consul agent:
// four controllers in this process, each over its own engine, share one
// rule of 400/s by demand, node-1 busy and the others idle. Each fault of
// node-1's report (garbage in its key, its session destroyed, a restart that
// finds the previous process's session holding its key) must leave the
// shares of every division the leader publishes summing to at most L; a
// restart must replace the stale report at once, not after the session's
// TTL.

// consulNode is one replica of the cluster, with the goroutine that offers
// it load.
type consulNode struct {
	node   string
	e      *engine.Engine
	c      *Controller
	logs   *testutil.Buffer
	cancel context.CancelFunc
	done   chan error
	stop   sync.Once
}

// startNode runs the controller of node against the agent at client, four
// replicas of weight 1 counted, as the daemon would with --node node
// --replicas 4 --demand-interval 200ms --consul-query-rate 10.
func startNode(t *testing.T, client *api.Client, node string, busy bool) *consulNode {
	t.Helper()
	set, err := descriptors.Compile(descriptors.File{Name: "r.yaml", Data: []byte(ruleYAML)})
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(set, bucket.NewStore(0), engine.Options{Weight: 0.25})
	if err != nil {
		t.Fatal(err)
	}
	clock := monotime.New()
	mv := membership.View{Source: "consul", Node: node, Total: 4, Local: 1, TotalWeight: 4, LocalWeight: 1, Weight: 0.25}
	logs := &testutil.Buffer{}
	c := New(NewEngine(e), client, Config{Service: "web", Group: engine.DefaultGroup, Prefix: "sharelimit/demand/",
		Interval: 200 * time.Millisecond, MaxWrites: 100, QueryRate: 10, Node: node, TopKeys: engine.DefaultTopKeys,
		View: func() membership.View { return mv }, Clock: clock,
		Logger: slog.New(slog.NewTextHandler(logs, nil)).With("component", "demand")})
	ctx, cancel := context.WithCancel(context.Background())
	n := &consulNode{node: node, e: e, c: c, logs: logs, cancel: cancel, done: make(chan error, 2)}
	go func() { n.done <- c.Run(ctx) }()
	if busy {
		// About 2,000 tokens a second asked for: five times the limit.
		go func() {
			descs := []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}
			var dec engine.Decision
			tk := time.NewTicker(25 * time.Millisecond)
			defer tk.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-tk.C:
				}
				if err := e.Decide(&dec, "a", descs, 50, clock()); err != nil {
					n.done <- err
					return
				}
			}
		}()
	}
	t.Cleanup(func() { n.shutdown(t) })
	return n
}

func (n *consulNode) shutdown(t *testing.T) {
	n.stop.Do(func() {
		n.cancel()
		if err := <-n.done; err != nil {
			t.Errorf("%s: %v", n.node, err)
		}
	})
}

// logged counts the log lines holding every one of parts.
func (n *consulNode) logged(parts ...string) int {
	count := 0
	for _, line := range strings.Split(n.logs.String(), "\n") {
		all := line != ""
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			count++
		}
	}
	return count
}

// counted reads one of the controller's counters by cause under its lock.
func (n *consulNode) counted(m func(c *Controller) map[string]uint64, cause string) uint64 {
	d := n.c
	d.mu.Lock()
	defer d.mu.Unlock()
	return m(d)[cause]
}

func badReportsOf(c *Controller) map[string]uint64  { return c.badReps }
func writeErrorsOf(c *Controller) map[string]uint64 { return c.writeErrs }

func (n *consulNode) rule(t *testing.T) Rule {
	t.Helper()
	rules := n.c.rules()
	if len(rules) != 1 {
		t.Fatalf("%s: demand rules %v", n.node, rules)
	}
	return rules[0]
}

// weight is the share in force.
func (n *consulNode) weight(t *testing.T) float64 {
	return n.e.GroupWeight(n.rule(t).Group).W
}

// shareUnder is the share this replica would take under p, from its own
// record of its reports, as it would apply p now.
func (n *consulNode) shareUnder(t *testing.T, p *demand.Params) float64 {
	b := n.rule(t)
	d := n.c
	now := d.wall()
	d.mu.Lock()
	defer d.mu.Unlock()
	old := d.params
	d.params = p
	defer func() { d.params = old }()
	w, _ := d.target(b, now)
	return w
}

// divisionWatch reads every parameter set the leader publishes and checks
// that the shares of the daemons under it sum to at most L.
type divisionWatch struct {
	t       *testing.T
	kv      *api.KV
	keys    consulkv.Keys
	last    []byte
	seen    int
	worst   float64
	overs   int
	nodes   func() []*consulNode
	example string
}

// poll reads the parameters once; a new set is checked.
func (w *divisionWatch) poll() {
	pair, _, err := w.kv.Get(w.keys.Params(), nil)
	if err != nil || pair == nil || bytes.Equal(pair.Value, w.last) {
		return
	}
	w.last = bytes.Clone(pair.Value)
	p, err := demand.DecodeParams(pair.Value)
	if err != nil {
		return
	}
	w.seen++
	var sum float64
	shares := map[string]float64{}
	for _, n := range w.nodes() {
		s := n.shareUnder(w.t, &p)
		shares[n.node] = s
		sum += s
	}
	w.worst = max(w.worst, sum)
	if sum > 1+1e-9 {
		w.overs++
		if w.example == "" {
			w.example = fmtShares(shares, sum)
		}
	}
}

// during polls every 20 ms for d, calling act (when set) before each poll.
func (w *divisionWatch) during(d time.Duration, act func()) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if act != nil {
			act()
		}
		w.poll()
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *divisionWatch) check(what string) {
	w.t.Helper()
	w.t.Logf("%s: %d divisions read, worst sum of shares %.4f of L", what, w.seen, w.worst)
	if w.seen == 0 {
		w.t.Errorf("%s: no division read", what)
	}
	if w.overs > 0 {
		w.t.Errorf("%s: %d of %d divisions summed to more than L, e.g. %s", what, w.overs, w.seen, w.example)
	}
	w.seen, w.worst, w.overs, w.example = 0, 0, 0, ""
}

func fmtShares(shares map[string]float64, sum float64) string {
	var b bytes.Buffer
	for _, node := range []string{"node-1", "node-2", "node-3", "node-4"} {
		if s, ok := shares[node]; ok {
			b.WriteString(node + "=")
			b.WriteString(trim(s))
			b.WriteString(" ")
		}
	}
	b.WriteString("sum=" + trim(sum))
	return b.String()
}

func trim(v float64) string { return strconv.FormatFloat(v, 'f', 4, 64) }

func TestDemandFaultsOnConsul(t *testing.T) {
	a := consultest.Start(t)
	nodes := []string{"node-1", "node-2", "node-3", "node-4"}
	for _, n := range nodes {
		a.RegisterInstance(n, "web-"+n, "web", true)
	}
	keys := consulkv.Keys{Prefix: "sharelimit/demand/", Service: "web"}
	kv := a.Client().KV()

	var mu sync.Mutex
	daemons := make([]*consulNode, len(nodes))
	for i, n := range nodes {
		daemons[i] = startNode(t, a.Client(), n, i == 0)
	}
	current := func() []*consulNode {
		mu.Lock()
		defer mu.Unlock()
		return append([]*consulNode(nil), daemons...)
	}
	w := &divisionWatch{t: t, kv: kv, keys: keys, nodes: current}
	busy := func(what string) {
		t.Helper()
		testutil.Eventually(t, 60*time.Second, testutil.Cond(func() bool { w.poll(); return current()[0].weight(t) > 0.6 }, "%s", what))
	}
	busy("node-1 takes the busy share")
	w.check("no fault")

	// Garbage in node-1's report key, written over and over for 3 s.
	w.during(3*time.Second, func() {
		if _, err := kv.Put(&api.KVPair{Key: keys.Report("node-1"), Value: []byte("garbage")}, nil); err != nil {
			t.Fatal(err)
		}
	})
	w.check("garbage in node-1's report key")
	// The leader counted the garbage and said so once, however many of
	// its divisions found it.
	var bad uint64
	warned := 0
	for _, n := range current() {
		bad += n.counted(badReportsOf, readUndecodable)
		warned += n.logged("level=WARN", `msg="demand report unusable`, "node=node-1", "cause=undecodable")
	}
	t.Logf("garbage: %d unusable reports counted, %d warnings", bad, warned)
	if bad == 0 || warned != 1 {
		t.Errorf("garbage: %d unusable reports counted and %d warnings, want some and exactly one", bad, warned)
	}
	busy("node-1 takes the busy share again after the garbage")

	// node-1's session destroyed behind its back: its report goes with it.
	pair, _, err := kv.Get(keys.Report("node-1"), nil)
	if err != nil || pair == nil || pair.Session == "" {
		t.Fatalf("node-1's report: %+v %v", pair, err)
	}
	if _, err := a.Client().Session().Destroy(pair.Session, nil); err != nil {
		t.Fatal(err)
	}
	w.during(3*time.Second, nil)
	w.check("node-1's session destroyed")
	busy("node-1 takes the busy share again after its session was destroyed")

	// node-1 dies and comes back at once: the previous process's session,
	// unrenewed but not expired (60 s TTL here), still holds its report,
	// which asked for little.
	current()[0].shutdown(t)
	dead, _, err := a.Client().Session().CreateNoChecks(&api.SessionEntry{Name: "sharelimit demand web node-1", TTL: "60s",
		Behavior: api.SessionBehaviorDelete, LockDelay: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	rid := demand.RuleIDOf(current()[1].rule(t).Identity)
	stale, err := demand.AppendReport(nil, &demand.Report{Seq: 1, At: time.Now().UnixNano(), Units: 1, Node: "node-1",
		Rules: []demand.RuleDemand{{ID: rid, Offered: 5, Admitted: 5}}})
	if err != nil {
		t.Fatal(err)
	}
	// Consul refuses the lock for the lock-delay (1 ms) after the shut
	// down process's session was destroyed: a stop that fast meets it.
	testutil.Eventually(t, 5*time.Second, testutil.Cond(func() bool {
		ok, _, err := kv.Acquire(&api.KVPair{Key: keys.Report("node-1"), Value: stale, Session: dead}, nil)
		if err != nil {
			t.Fatalf("the stale report: %v", err)
		}
		return ok
	}, "the stale report is written under the dead session"))
	w.during(time.Second, nil) // the leader divides with the stale report
	restarted := startNode(t, a.Client(), "node-1", true)
	mu.Lock()
	daemons[0] = restarted
	mu.Unlock()
	start := time.Now()
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool {
		w.poll()
		p, _, err := kv.Get(keys.Report("node-1"), nil)
		return err == nil && p != nil && p.Session != dead && p.Session != ""
	}, "the restarted node-1 writes its own report, well before the stale session's TTL"))
	t.Logf("the restarted node-1's report replaced the stale one after %v", time.Since(start).Round(10*time.Millisecond))
	w.during(2*time.Second, nil)
	w.check("node-1 restarted while its previous session held its report")
	if restarted.logged("level=WARN", "ended the session of a previous process", dead) != 1 {
		t.Errorf("the take-over was not logged once:\n%s", restarted.logs.String())
	}
	busy("the restarted node-1 takes the busy share")

	// node-2's key held by a session of another name (its own session
	// destroyed to free the key): its writes are refused; it says so once
	// per cause (its session gone, then the key held), counts each, shows
	// it on the status, and says when it writes again.
	node2 := current()[1]
	var foreign string
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool {
		if foreign == "" {
			foreign, _, err = a.Client().Session().CreateNoChecks(&api.SessionEntry{Name: "not sharelimit", TTL: "60s",
				Behavior: api.SessionBehaviorDelete, LockDelay: time.Millisecond}, nil)
			if err != nil {
				t.Fatal(err)
			}
		}
		if p, _, err := kv.Get(keys.Report("node-2"), nil); err == nil && p != nil && p.Session != "" && p.Session != foreign {
			a.Client().Session().Destroy(p.Session, nil)
		}
		ok, _, err := kv.Acquire(&api.KVPair{Key: keys.Report("node-2"), Value: []byte("theirs"), Session: foreign}, nil)
		return err == nil && ok
	}, "a foreign session holds node-2's key"))
	// Its session destroyed, its next write makes a new one, and the writes
	// after are refused as held: as many as it gets to make, however busy
	// the machine, so wait for two rather than for a time.
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool {
		w.poll()
		st := node2.c.Status()
		return node2.counted(writeErrorsOf, writeHeld) >= 2 && st != nil && strings.HasPrefix(st.WriteError, "held: ")
	}, "node-2's writes refused as held, twice"))
	w.check("node-2's key held by another session")
	st := node2.c.Status()
	if held := node2.counted(writeErrorsOf, writeHeld); held < 2 || st == nil || !strings.HasPrefix(st.WriteError, "held: ") {
		t.Errorf("node-2's refused writes: %d counted, status %+v", held, st)
	}
	if got := node2.logged("level=WARN", `msg="demand report not written`, "cause=held"); got != 1 {
		t.Errorf("node-2 warned %d times of its refused writes, want once:\n%s", got, node2.logs.String())
	}
	if _, err := a.Client().Session().Destroy(foreign, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("node-2's log:\n%s", node2.logs.String())
		}
	})
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool {
		w.poll()
		st := node2.c.Status()
		return st != nil && st.WriteError == "" && node2.logged("level=INFO", "demand report written again") >= 1
	}, "node-2 writes again, and says so"))
	w.during(time.Second, nil)
	w.check("node-2 writing again")
}
