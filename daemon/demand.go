package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	"golang.org/x/sync/errgroup"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/demand/consulkv"
	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/server"
)

// Demand sharing's timing, beyond the flags.
const (
	// demandTick is how often the meters are read, a write considered and
	// the shares re-evaluated.
	demandTick = 100 * time.Millisecond
	// demandSessionTTL is the session's TTL, Consul's minimum: a dead
	// replica's report is gone within about twice that.
	demandSessionTTL = 10 * time.Second
	// demandSessionMargin: a replica whose session went unrenewed for the
	// TTL less this takes at most its equal share.
	demandSessionMargin = 2 * time.Second
	// demandThreshold: a rule's demand must move by more than this part to
	// be written before the heartbeat.
	demandThreshold = 0.1
	// demandHeartbeats: with no move, a replica writes every this many
	// (stretched) intervals, so its report is never older than the cutoff.
	demandHeartbeats = 2
	// demandGrowSlack is added to one query interval to make the delay
	// before a grown share applies: every replica has had the parameters
	// that shrink the others by then.
	demandGrowSlack = 250 * time.Millisecond
	// demandTauDivisor: the meters' time constant is the interval divided
	// by this. A short one lets a replica whose demand fell release its
	// share within a report or two (its peers wait for it); the write
	// threshold and the once-per-interval cap keep the noise of a short
	// window from costing writes.
	demandTauDivisor = 4
	// demandLeaderDivisor: the leader divides this many times per interval,
	// so a report waits at most half an interval to be divided.
	demandLeaderDivisor = 2
	// maxShownReplicas bounds the replicas the admin pages list per rule.
	maxShownReplicas = 64
	// demandWriteTimeout bounds one Consul write.
	demandWriteTimeout = 2 * time.Second
)

// demandSettings are the flags and timings a demander runs with.
type demandSettings struct {
	prefix    string
	interval  time.Duration
	maxWrites float64
	queryRate float64 // --consul-query-rate: the params watch's pacing
	node      string  // --node, or the agent's node name once known
	topKeys   int     // --demand-top-keys
}

// demander shares the demand rules of one Consul service's domains by
// demand: it meters them, publishes this replica's report, campaigns to be
// the service's leader (which divides), watches the leader's parameters and
// sets each rule's group weight to this replica's share. The Consul part
// starts only once the service has a demand rule, so a daemon that shares
// nothing by demand writes nothing to Consul. Safe for concurrent use.
type demander struct {
	v      *view
	engine *descriptors.Engine
	client *api.Client
	set    demandSettings
	log    *slog.Logger
	wall   func() time.Time

	mu       sync.Mutex
	rates    map[string]*demand.Rates // by rule identity
	hist     demand.History
	params   *demand.Params
	gotAt    time.Time // when params arrived
	badParam uint64
	badReps  map[string]uint64 // reports the leader could not use, by cause (readCauses)
	last     *demand.Report    // the last report written, as decoded
	lastAt   time.Time
	seq      uint64
	writes   uint64
	failures uint64
	// Loud failures (demand_loud.go): why writes fail, by cause; the last
	// failure while it lasts; what has been logged; the reports the last
	// division could not use; how the parameters in force counted this
	// replica's report.
	writeErrs map[string]uint64
	writeErr  string
	writeLog  causeLog
	readLog   causeLog
	bad       []badReport
	standing  demand.Standing
	grows     map[int][]grow // by group: larger shares waiting to apply, by time
	shares    map[string]float64
	started   bool
	sessGen   uint64
	division  []server.DemandReplica // the last division, when leading
	// Per-value rules, by rule identity: the meters of their hot values
	// (by value ID) and their candidates.
	hotRates    map[string]map[uint64]*demand.Rates
	cands       map[string]*demand.Candidates
	warnedSlots bool // warned once that the leader makes more values hot than this replica can hold

	session *consulkv.Session
	pub     *consulkv.Publisher
	leader  *consulkv.Leader
	watch   *consulkv.Watcher
}

// grow is a larger share held back until at.
type grow struct {
	w  float64
	at time.Time
}

func newDemander(v *view, e *descriptors.Engine, client *api.Client, set demandSettings, log *slog.Logger) *demander {
	return &demander{v: v, engine: e, client: client, set: set, log: log, wall: time.Now,
		rates: map[string]*demand.Rates{}, grows: map[int][]grow{}, shares: map[string]float64{},
		hotRates: map[string]map[uint64]*demand.Rates{}, cands: map[string]*demand.Candidates{},
		badReps: map[string]uint64{}, writeErrs: map[string]uint64{}, standing: demand.Absent}
}

// rules are the installed demand rules of this view's domains.
func (d *demander) rules() []descriptors.DemandBinding {
	var out []descriptors.DemandBinding
	for _, b := range d.engine.DemandRules() {
		if b.State.DomainGroup() == d.v.group {
			out = append(out, b)
		}
	}
	return out
}

// stretched is the write interval for the service's current count.
func (d *demander) stretched() time.Duration {
	return demand.Stretch(d.set.interval, d.v.cur.Load().Total, d.set.maxWrites)
}

// Run meters, writes and re-divides until ctx ends.
func (d *demander) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		tk := time.NewTicker(demandTick)
		defer tk.Stop()
		for {
			select {
			case <-gctx.Done():
				return nil
			case <-tk.C:
			}
			rules := d.rules()
			if len(rules) > 0 && !d.isStarted() {
				if err := d.start(gctx, g); err != nil {
					return err
				}
			}
			d.tick(gctx, rules)
		}
	})
	return g.Wait()
}

func (d *demander) isStarted() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.started
}

// start builds the Consul part and runs it in g. It waits for the node's
// name, which names the report's key: --node, or the agent's once the
// membership watch has learnt it.
func (d *demander) start(ctx context.Context, g *errgroup.Group) error {
	node := d.set.node
	if node == "" {
		node = d.v.cur.Load().Node
	}
	if node == "" {
		return nil // not known yet: the next tick tries again
	}
	keys := consulkv.Keys{Prefix: d.set.prefix, Service: d.v.service}
	session, err := consulkv.NewSession(d.client, consulkv.SessionConfig{
		Name: "sharelimit demand " + d.v.service + " " + node, TTL: demandSessionTTL, Logger: d.log,
	})
	if err != nil {
		return fmt.Errorf("demand sharing for service %s: %w", d.v.service, err)
	}
	leader, err := consulkv.NewLeader(d.client, consulkv.LeaderConfig{
		Keys: keys, Node: node, Interval: d.set.interval / demandLeaderDivisor,
		Every:    func() time.Duration { return d.stretched() / demandLeaderDivisor },
		MaxValue: demand.MaxSize, Steal: d.steal, Logger: d.log,
	}, session, d.divide)
	if err != nil {
		return fmt.Errorf("demand sharing for service %s: %w", d.v.service, err)
	}
	watch, err := consulkv.NewWatcher(d.client, consulkv.WatcherConfig{
		Keys: keys, Rate: d.set.queryRate, MaxValue: demand.MaxSize, Logger: d.log,
	}, d.onParams)
	if err != nil {
		return fmt.Errorf("demand sharing for service %s: %w", d.v.service, err)
	}
	d.mu.Lock()
	d.set.node = node
	d.session, d.leader, d.watch = session, leader, watch
	d.pub = consulkv.NewPublisher(d.client, keys, node, session)
	d.started = true
	d.mu.Unlock()
	g.Go(func() error { return session.Run(ctx) })
	g.Go(func() error { return leader.Run(ctx) })
	g.Go(func() error { return watch.Run(ctx) })
	d.log.Info("demand sharing started", "service", d.v.service, "prefix", d.set.prefix, "node", node)
	return nil
}

// passing reports whether node has a passing instance in the last answer
// from Consul; true while that is not known.
func (d *demander) passing(node string) bool {
	nodes := d.v.consul.PassingNodes()
	if nodes == nil {
		return true
	}
	_, found := slices.BinarySearch(nodes, node)
	return found
}

// steal is the leader's Steal: a holder whose node has no passing instance
// and whose parameters have not come for three of its rounds is gone (killed,
// and deregistered or failing its check); its session is ended rather than
// left to expire, which takes Consul up to twice the TTL.
func (d *demander) steal(holder string) bool {
	if d.passing(holder) {
		return false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	quiet := 3 * d.stretched() / demandLeaderDivisor
	return d.wall().Sub(d.gotAt) > max(quiet, time.Second)
}

// tick reads the meters, writes a report when one is due and re-divides.
func (d *demander) tick(ctx context.Context, rules []descriptors.DemandBinding) {
	now := d.wall()
	d.mu.Lock()
	for _, b := range rules {
		r := d.rates[b.State.Identity()]
		if r == nil {
			r = &demand.Rates{}
			d.rates[b.State.Identity()] = r
		}
		off, adm := b.State.Counts()
		r.Update(off, adm, now, d.set.interval/demandTauDivisor)
		if b.State.PerValue() {
			d.meterValues(b, now)
		}
	}
	var report *demand.Report
	if d.started {
		if _, gen := d.session.ID(); gen != d.sessGen {
			// A new session: the old one's report is gone with it.
			d.sessGen = gen
			d.hist.Reset()
			d.last = nil
		}
		report = d.due(rules, now)
	}
	d.mu.Unlock()
	if report != nil {
		d.write(ctx, report, now)
	}
	d.apply(rules, now)
}

// due returns the report to write now, or nil. Called with mu held.
func (d *demander) due(rules []descriptors.DemandBinding, now time.Time) *demand.Report {
	if len(rules) == 0 {
		return nil
	}
	every := d.stretched()
	since := now.Sub(d.lastAt)
	if d.last != nil && since < every {
		return nil
	}
	mv := d.v.cur.Load()
	r := &demand.Report{Seq: d.seq + 1, At: now.UnixNano(), Units: uint32(max(mv.LocalWeight, 1)), Node: d.set.node}
	values := 0
	for _, b := range rules {
		rt := d.rates[b.State.Identity()]
		rd := demand.RuleDemand{ID: demand.RuleIDOf(b.State.Identity()), Offered: rt.Offered, Admitted: rt.Admitted}
		if b.State.PerValue() {
			rd.Values = d.values(b, d.engine.GroupWeight(b.State.DomainGroup()).W)
			if values+len(rd.Values) > demand.MaxValues {
				rd.Values = nil // past the format's bound: its values keep equal shares
			}
			values += len(rd.Values)
		}
		r.Rules = append(r.Rules, rd)
	}
	slices.SortFunc(r.Rules, func(a, b demand.RuleDemand) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	r.Rules = slices.CompactFunc(r.Rules, func(a, b demand.RuleDemand) bool { return a.ID == b.ID })
	if d.last == nil || since >= demandHeartbeats*every || d.last.Units != r.Units || len(d.last.Rules) != len(r.Rules) {
		return r
	}
	for i, rd := range r.Rules {
		old := d.last.Rules[i]
		if old.ID != rd.ID || demand.Moved(old.Offered, rd.Offered, demandThreshold, 1) || len(old.Values) != len(rd.Values) {
			return r
		}
		for j, v := range rd.Values {
			if ov := old.Values[j]; ov.ID != v.ID || demand.Moved(ov.Offered, v.Offered, demandThreshold, 1) {
				return r
			}
		}
	}
	return nil
}

// write publishes r and records it as decoded.
func (d *demander) write(ctx context.Context, r *demand.Report, now time.Time) {
	b, err := demand.AppendReport(nil, r)
	if err != nil {
		d.log.Error("demand report not encodable", "service", d.v.service, "err", err)
		return
	}
	decoded, err := demand.DecodeReport(b)
	if err != nil {
		d.log.Error("demand report does not decode", "service", d.v.service, "err", err)
		return
	}
	d.mu.Lock()
	pub := d.pub
	d.mu.Unlock()
	wctx, cancel := context.WithTimeout(ctx, demandWriteTimeout)
	index, err := pub.Publish(wctx, b)
	cancel()
	d.mu.Lock()
	defer d.mu.Unlock()
	switch {
	case errors.Is(err, consulkv.ErrNoSession):
		// Nothing was written; try again next tick.
	case err != nil:
		// Nothing was written, or (an error on the way back) it may have
		// been: either way the history does not record it. A division
		// that counted it lists this replica at an index it does not
		// know, which it reads as Unknown, the floor of its share.
		cause := writeCause(err)
		d.failures++
		d.writeErrs[cause]++
		d.writeErr = cause + ": " + err.Error()
		d.lastAt = now // try again in an interval
		if d.writeLog.fail("", cause, now) {
			d.log.Warn("demand report not written; until one is, the leader counts this replica at its equal share or less, and it takes no more",
				"service", d.v.service, "cause", cause, "err", err)
		}
	default:
		d.writes++
		d.seq = r.Seq
		d.hist.Add(index, decoded)
		d.last, d.lastAt = &decoded, now
		d.writeErr = ""
		if cause := d.writeLog.ok(""); cause != "" {
			d.log.Info("demand report written again", "service", d.v.service, "after", cause)
		}
	}
}

// onParams is the watch's delivery: the leader's parameters, or nil when
// the key is gone.
func (d *demander) onParams(value []byte, _ uint64) {
	if value == nil {
		return // the last parameters stand until they go stale
	}
	p, err := demand.DecodeParams(value)
	d.mu.Lock()
	if err != nil {
		d.badParam++
		d.mu.Unlock()
		d.log.Warn("demand parameters ignored", "service", d.v.service, "err", err)
		return
	}
	d.params, d.gotAt = &p, d.wall()
	d.mu.Unlock()
	d.apply(d.rules(), d.wall())
}

// staleAfter is how old parameters may be before equal shares return.
func (d *demander) staleAfter() time.Duration {
	return max(10*time.Second, 10*d.stretched())
}

// growDelay is how long a grown share waits: one query interval of the
// params watch and some slack, by when every replica has the parameters
// that shrink the others.
func (d *demander) growDelay() time.Duration {
	return time.Duration(float64(time.Second)/d.set.queryRate) + demandGrowSlack
}

// usable is the parameters in force for rule b when they are fresh and
// divide the limit this replica's config has; nil otherwise (the rule then
// keeps equal shares). Called with mu held.
func (d *demander) usable(b descriptors.DemandBinding, now time.Time) *demand.RuleParams {
	lim := b.Rule.Limit()
	p := d.params
	if p == nil || lim == nil || now.Sub(time.Unix(0, p.At)) > d.staleAfter() {
		return nil
	}
	rp := p.Find(demand.RuleIDOf(b.State.Identity()))
	limit := lim.Params().Rate
	if rp == nil || !(limit > 0) || rp.Limit < limit*(1-1e-6) || rp.Limit > limit*(1+1e-6) {
		return nil // the leader divides another limit: its config differs
	}
	return rp
}

// target is this replica's weight for one demand rule with one bucket: its
// demand share under the current parameters, or its equal share without
// usable ones. Called with mu held.
func (d *demander) target(b descriptors.DemandBinding, now time.Time) float64 {
	equal := d.engine.GroupWeight(b.State.DomainGroup()).W
	rp := d.usable(b, now)
	if rp == nil {
		return equal
	}
	return d.weigh(d.params.Rule(rp), func(rep *demand.Report) (float64, bool) {
		if rd := rep.Find(rp.ID); rd != nil {
			return rd.Offered, true
		}
		return 0, false
	}, rp.Limit, equal, now)
}

// weigh is this replica's weight under division rule, given what its own
// report as the division counted it said (own: the figure, or false when
// the report did not name it, which the leader counted as absent). Called
// with mu held.
func (d *demander) weigh(rule demand.Rule, own func(*demand.Report) (float64, bool), limit, equal float64, now time.Time) float64 {
	mv := d.v.cur.Load()
	view := uint32(max(mv.TotalWeight, 1))
	// Only a report the parameters list, at an index this replica wrote,
	// was divided with: the leader counted any other replica at its equal
	// share and left it that, or counted a report under this replica's
	// name that it does not know (a previous process's, say) and left it
	// that report's share, at least the floor.
	rep, standing := d.hist.Reported(d.params, d.set.node)
	units, offered, absent := uint32(max(mv.LocalWeight, 1)), 0.0, false
	switch standing {
	case demand.Counted:
		units = rep.Units
		var named bool
		offered, named = own(&rep)
		absent = !named
	case demand.Absent:
		absent = true
	case demand.Unknown:
		// The smallest share a counted replica gets: demand 0.
	}
	share, ok := demand.Share(rule, units, offered, absent, view)
	if !ok {
		return equal
	}
	w := min(1, max(share/limit, 1e-9))
	if standing != demand.Counted {
		// Never more than the equal share from a division that did not
		// count this replica's own report (Share gives no more already;
		// the membership's equal share may be smaller still).
		w = min(w, equal)
	}
	if mv.Local == 0 {
		// This node has no passing instance: the leader does not count
		// this replica's report (it is not one of the replicas the view
		// divides among), so it may take no more than its equal share.
		w = min(w, equal)
	}
	if d.session != nil && now.Sub(d.session.Renewed()) > demandSessionTTL-demandSessionMargin {
		// The session may expire soon, its report with it, and the
		// leader then counts this replica at its equal share: take no
		// more than that before it can happen.
		w = min(w, equal)
	}
	return w
}

// apply sets each demand rule's weight, and each hot value's: a smaller one
// at once, a larger one once it has waited growDelay.
func (d *demander) apply(rules []descriptors.DemandBinding, now time.Time) {
	d.mu.Lock()
	defer d.mu.Unlock()
	mono := d.v.clock()
	if d.params != nil {
		_, d.standing = d.hist.Reported(d.params, d.set.node)
	}
	for _, b := range rules {
		if b.State.PerValue() {
			d.applyValues(b, now, mono)
			continue
		}
		want := d.target(b, now)
		d.shares[b.State.Identity()] = want
		d.aim(b.State.Group(), want, now, mono)
	}
}

// aim moves group g's weight towards want: a smaller one at once, a larger
// one once it has waited growDelay. Called with mu held.
func (d *demander) aim(g int, want float64, now time.Time, mono int64) {
	cur := d.engine.GroupWeight(g).W
	switch {
	case want <= cur:
		delete(d.grows, g)
		d.engine.SetGroupWeight(g, want, mono)
	default:
		// A grow waits growDelay from the parameters that asked for
		// it. A bigger one, from newer parameters the others may not
		// have yet, waits its own full delay, while the smaller one
		// already waiting still applies at its time.
		steps := d.grows[g]
		if n := len(steps); n == 0 || want > steps[n-1].w {
			steps = append(steps, grow{w: want, at: now.Add(d.growDelay())})
		}
		// Grows asked for more than want now are capped at it.
		apply := cur
		keep := steps[:0]
		for _, st := range steps {
			st.w = min(st.w, want)
			if !now.Before(st.at) {
				apply = max(apply, st.w)
				continue
			}
			keep = append(keep, st)
		}
		if apply > cur {
			d.engine.SetGroupWeight(g, apply, mono)
		}
		if len(keep) == 0 {
			delete(d.grows, g)
		} else {
			d.grows[g] = keep
		}
	}
}

// reportEntry is one report of a snapshot, and whether the division counts
// it: only a report the parameters list does (a report under a key of
// another node's name, or at an index they cannot name, adds its units to
// the division and nothing else).
type reportEntry struct {
	rep     demand.Report
	counted bool
	index   uint64
}

// divide is the leader's division of one snapshot of the reports.
func (d *demander) divide(snap consulkv.Snapshot) ([]byte, error) {
	now := d.wall()
	mv := d.v.cur.Load()
	var reps []reportEntry
	var bad []badReport
	atIndex := map[uint64]int{}
	for _, kv := range snap.Reports {
		if !d.passing(kv.Node) {
			// Its node has left the service (deregistered, or failing its
			// check): it is not one of the replicas the view divides among.
			continue
		}
		r, why := readReport(kv)
		if why != nil {
			bad = append(bad, *why)
			if why.cause != readWrongNode {
				continue // its replica is not listed, and keeps its equal share
			}
		}
		// A report stands until its session ends (it is then deleted)
		// or its node leaves the service. Judging it stale sooner would
		// hand its share to the others while the replica, cut off from
		// Consul, still enforces it; the replica itself falls back to at
		// most its equal share before its session can expire (target).
		e := reportEntry{rep: r, counted: why == nil && kv.ModifyIndex >= 1 && kv.ModifyIndex <= snap.Index, index: kv.ModifyIndex}
		if e.counted {
			atIndex[e.index]++
		}
		reps = append(reps, e)
	}
	h, f := demand.DefaultHeadroom, demand.DefaultFloor
	p := demand.Params{At: now.UnixNano(), Snapshot: snap.Index, Headroom: h, Floor: f, Leader: d.set.node}
	for i := range reps {
		e := &reps[i]
		// Two reports written at one index (one transaction) could not
		// be told apart by their replicas: neither counts. Past
		// MaxReports, the rest count at their equal shares.
		if e.counted && (atIndex[e.index] > 1 || len(p.Reports) == demand.MaxReports) {
			e.counted = false
		}
		if e.counted {
			p.Reports = append(p.Reports, demand.ReportRef{Index: e.index, Node: demand.TagOf(e.rep.Node)})
		}
	}
	slices.SortFunc(p.Reports, func(a, b demand.ReportRef) int { return cmp.Compare(a.Index, b.Index) })
	d.noteBad(bad, now)
	view := uint32(max(mv.TotalWeight, 1))
	var division []server.DemandReplica
	values := 0
	for _, b := range d.rules() {
		lim := b.Rule.Limit()
		if lim == nil {
			continue
		}
		id := demand.RuleIDOf(b.State.Identity())
		if b.State.PerValue() {
			rp, units, shown := d.divideValues(b, id, lim.Params().Rate, view, reps, h, f, demand.MaxValues-values)
			values += len(rp.Values)
			if len(rp.Values) > 0 {
				p.Units = units
			}
			p.Rules = append(p.Rules, rp)
			division = append(division, shown...)
			continue
		}
		wants := make([]demand.Want, 0, len(reps))
		var admitted float64
		for _, e := range reps {
			w := demand.Want{Units: e.rep.Units, Absent: !e.counted}
			if rd := e.rep.Find(id); rd != nil && e.counted {
				w.Offered = rd.Offered
				admitted += rd.Admitted
			} else {
				w.Absent = true
			}
			wants = append(wants, w)
		}
		rule := demand.Divide(lim.Params().Rate, view, wants, h, f)
		if rule.Units == 0 {
			continue
		}
		p.Units = rule.Units
		p.Rules = append(p.Rules, demand.RuleParams{ID: id, Limit: rule.Limit, K: rule.K, R: rule.R, Admitted: admitted})
		// What each replica gets, for the admin pages: the busiest first,
		// at most maxShownReplicas of them.
		shown := make([]server.DemandReplica, 0, len(reps))
		for i, e := range reps {
			g, _ := demand.Share(rule, wants[i].Units, wants[i].Offered, wants[i].Absent, view)
			r := server.DemandReplica{Rule: b.Rule.Path(), Node: e.rep.Node, Units: e.rep.Units, Offered: wants[i].Offered,
				Share: g / rule.Limit, Absent: wants[i].Absent}
			if rd := e.rep.Find(id); rd != nil {
				r.Admitted = rd.Admitted
			}
			shown = append(shown, r)
		}
		slices.SortStableFunc(shown, func(a, b server.DemandReplica) int { return cmpDesc(a.Offered, b.Offered) })
		division = append(division, shown[:min(len(shown), maxShownReplicas)]...)
	}
	d.mu.Lock()
	d.division = division
	d.mu.Unlock()
	slices.SortFunc(p.Rules, func(a, b demand.RuleParams) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	p.Rules = slices.CompactFunc(p.Rules, func(a, b demand.RuleParams) bool { return a.ID == b.ID })
	return demand.AppendParams(nil, &p)
}

func cmpDesc(a, b float64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}
