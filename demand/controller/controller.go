package controller

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	"golang.org/x/sync/errgroup"

	"github.com/sharelimit/sharelimit/demand"
	"github.com/sharelimit/sharelimit/demand/consulkv"
	"github.com/sharelimit/sharelimit/internal/monotime"
	"github.com/sharelimit/sharelimit/membership"
)

// Demand sharing's timing, beyond the flags.
const (
	// tickEvery is how often the meters are read, a write considered and
	// the shares re-evaluated.
	tickEvery = 100 * time.Millisecond
	// sessionTTL is the session's TTL, Consul's minimum: a dead replica's
	// report is gone within about twice that.
	sessionTTL = 10 * time.Second
	// sessionMargin: a replica whose session went unrenewed for the TTL
	// less this takes at most its equal share.
	sessionMargin = 2 * time.Second
	// threshold: a rule's demand must move by more than this part to be
	// written before the heartbeat.
	threshold = 0.1
	// heartbeats: with no move, a replica writes every this many
	// (stretched) intervals, so its report is never older than the cutoff.
	heartbeats = 2
	// growSlack is added to one query interval to make the delay before a
	// grown share applies: every replica has had the parameters that
	// shrink the others by then.
	growSlack = 250 * time.Millisecond
	// tauDivisor: the meters' time constant is the interval divided by
	// this. A short one lets a replica whose demand fell release its share
	// within a report or two (its peers wait for it); the write threshold
	// and the once-per-interval cap keep the noise of a short window from
	// costing writes.
	tauDivisor = 4
	// leaderDivisor: the leader divides this many times per interval, so a
	// report waits at most half an interval to be divided.
	leaderDivisor = 2
	// maxShown bounds the replicas the admin pages list per rule.
	maxShown = 64
	// writeTimeout bounds one Consul write.
	writeTimeout = 2 * time.Second
)

// Config is what a Controller runs with: the flags, and the membership view
// of its service.
type Config struct {
	Service   string        // the Consul service whose domains it shares
	Group     int           // the weight group of those domains (the view's)
	Prefix    string        // --demand-prefix
	Interval  time.Duration // --demand-interval
	MaxWrites float64       // --demand-max-writes
	QueryRate float64       // --consul-query-rate: the params watch's pacing
	Node      string        // --node; "" for the agent's, once View knows it
	TopKeys   int           // --demand-top-keys
	// View returns the service's membership view in force.
	View func() membership.View
	// Passing returns the nodes with a passing instance in the last
	// answer from Consul, sorted; nil while that is not known.
	Passing func() []string
	// Hold is how long a report stays counted after the leader last saw
	// it from a node with a passing instance, once its node leaves the
	// service or the report goes with its session: a replica that died
	// may leave Envoys enforcing its share, through RLQS assignments, that
	// long (--rlqs-ttl). 0 drops such a report at once.
	Hold time.Duration
	// Clock is the engine's clock.
	Clock monotime.Clock
	// Logger receives what the controller does; nil discards.
	Logger *slog.Logger
}

// Controller shares the demand rules of one Consul service's domains by
// demand: it meters them, publishes this replica's report, campaigns to be
// the service's leader (which divides), watches the leader's parameters and
// sets each rule's group weight to this replica's share. The Consul part
// starts only once the service has a demand rule, so a daemon that shares
// nothing by demand writes nothing to Consul. Safe for concurrent use; use
// New, and Run it once.
type Controller struct {
	eng    Engine
	client *api.Client
	set    Config
	log    *slog.Logger
	wall   func() time.Time

	mu       sync.Mutex
	rates    map[string]*demand.Rates // by rule identity
	hist     demand.History
	params   *demand.Params
	gotAt    time.Time // when params arrived
	badParam uint64
	badReps  map[string]uint64 // reports the leader could not use, by cause (readCauses)
	// The leader's memory for frozen: when it first found each replica
	// gone or restarted; each passing node's report session; the division
	// (by its time) of the leader it took the lead from, and when; when
	// this process first divided.
	left     map[demand.NodeTag]time.Time
	sessions map[string]string
	took     int64
	tookAt   time.Time
	born     time.Time
	last     *demand.Report // the last report written, as decoded
	lastAt   time.Time
	seq      uint64
	writes   uint64
	failures uint64
	// Failures told (failures.go): why writes fail, by cause; the last
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
	sessGen   uint64
	division  []Replica // the last division, when leading
	// Per-value rules, by rule identity: the meters of their hot values
	// (by value ID) and their candidates.
	hotRates    map[string]map[uint64]*demand.Rates
	cands       map[string]*demand.Candidates
	warnedSlots bool // warned once that the leader makes more values hot than this replica can hold

	st store // nil until the Consul part has started
}

// store is the Consul side the controller writes through: consulkv's
// session, publisher and leader lock (consulStore), or a test's fake.
type store interface {
	// Publish writes this replica's report; it returns the index the
	// write got.
	Publish(ctx context.Context, value []byte) (index uint64, err error)
	// Session returns the session's generation, which changes when it is
	// replaced, and when it was last renewed.
	Session() (gen uint64, renewed time.Time)
	// Leading reports whether this replica holds the leader lock.
	Leading() bool
	// Adopted returns, once, the report a previous process of this
	// replica held when this one took its key over, and its index.
	Adopted() (value []byte, index uint64, ok bool)
}

// grow is a larger share held back until at.
type grow struct {
	w  float64
	at time.Time
}

// New returns the controller of cfg.Service's demand rules in eng; client
// reaches Consul once the service has one. It starts nothing: Run does.
func New(eng Engine, client *api.Client, cfg Config) *Controller {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Controller{eng: eng, client: client, set: cfg, log: log, wall: time.Now,
		rates: map[string]*demand.Rates{}, grows: map[int][]grow{}, shares: map[string]float64{},
		hotRates: map[string]map[uint64]*demand.Rates{}, cands: map[string]*demand.Candidates{},
		badReps: map[string]uint64{}, writeErrs: map[string]uint64{}, standing: demand.Absent, left: map[demand.NodeTag]time.Time{}}
}

// rules are the installed demand rules of the service's domains.
func (c *Controller) rules() []Rule { return c.eng.Rules(c.set.Group) }

// stretched is the write interval for the service's current count.
func (c *Controller) stretched() time.Duration {
	return demand.Stretch(c.set.Interval, c.set.View().Total, c.set.MaxWrites)
}

// Run meters, writes and re-divides until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		tk := time.NewTicker(tickEvery)
		defer tk.Stop()
		for {
			select {
			case <-gctx.Done():
				return nil
			case <-tk.C:
			}
			if !c.started() && len(c.rules()) > 0 {
				if err := c.start(gctx, g); err != nil {
					return err
				}
			}
			c.tick(gctx)
		}
	})
	return g.Wait()
}

func (c *Controller) started() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.st != nil
}

// ViewChanged re-applies the shares after the service's membership view
// changed: the equal share moved, and the units the shares scale by, and a
// shrink applies at once here too.
func (c *Controller) ViewChanged() { c.apply(c.wall()) }

// start builds the Consul part and runs it in g. It waits for the node's
// name, which names the report's key: --node, or the agent's once the
// membership watch has learnt it.
func (c *Controller) start(ctx context.Context, g *errgroup.Group) error {
	node := c.set.Node
	if node == "" {
		node = c.set.View().Node
	}
	if node == "" {
		return nil // not known yet: the next tick tries again
	}
	keys := consulkv.Keys{Prefix: c.set.Prefix, Service: c.set.Service}
	session, err := consulkv.NewSession(c.client, consulkv.SessionConfig{
		Name: "sharelimit demand " + c.set.Service + " " + node, TTL: sessionTTL, Logger: c.log,
		// With a hold, this replica's Envoys may enforce the share its
		// report got after it exits: the report stays until the session
		// expires, or the next process takes it over and adopts it.
		Linger: c.set.Hold > 0,
	})
	if err != nil {
		return fmt.Errorf("demand sharing for service %s: %w", c.set.Service, err)
	}
	leader, err := consulkv.NewLeader(c.client, consulkv.LeaderConfig{
		Keys: keys, Node: node, Interval: c.set.Interval / leaderDivisor,
		Every:    func() time.Duration { return c.stretched() / leaderDivisor },
		MaxValue: demand.MaxSize, Steal: c.steal, Logger: c.log,
	}, session, c.divide)
	if err != nil {
		return fmt.Errorf("demand sharing for service %s: %w", c.set.Service, err)
	}
	watch, err := consulkv.NewWatcher(c.client, consulkv.WatcherConfig{
		Keys: keys, Rate: c.set.QueryRate, MaxValue: demand.MaxSize, Logger: c.log,
	}, c.onParams)
	if err != nil {
		return fmt.Errorf("demand sharing for service %s: %w", c.set.Service, err)
	}
	c.attach(node, consulStore{session: session, leader: leader, pub: consulkv.NewPublisher(c.client, keys, node, session)})
	g.Go(func() error { return session.Run(ctx) })
	g.Go(func() error { return leader.Run(ctx) })
	g.Go(func() error { return watch.Run(ctx) })
	c.log.Info("demand sharing started", "service", c.set.Service, "prefix", c.set.Prefix, "node", node)
	return nil
}

// attach puts st in use as node's store.
func (c *Controller) attach(node string, st store) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.set.Node = node
	c.st = st
}

// consulStore is the store on Consul KV.
type consulStore struct {
	session *consulkv.Session
	leader  *consulkv.Leader
	pub     *consulkv.Publisher
}

func (s consulStore) Publish(ctx context.Context, value []byte) (uint64, error) {
	return s.pub.Publish(ctx, value)
}

func (s consulStore) Session() (uint64, time.Time) {
	_, gen := s.session.ID()
	return gen, s.session.Renewed()
}

func (s consulStore) Leading() bool { return s.leader.IsLeader() }

func (s consulStore) Adopted() ([]byte, uint64, bool) { return s.pub.Adopted() }

// passing reports whether node has a passing instance in the last answer
// from Consul; true while that is not known.
func (c *Controller) passing(node string) bool {
	if c.set.Passing == nil {
		return true
	}
	nodes := c.set.Passing()
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
func (c *Controller) steal(holder string) bool {
	if c.passing(holder) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	quiet := 3 * c.stretched() / leaderDivisor
	return c.wall().Sub(c.gotAt) > max(quiet, time.Second)
}

// tick reads the meters, writes a report when one is due and re-divides.
func (c *Controller) tick(ctx context.Context) {
	now := c.wall()
	c.mu.Lock()
	rules := c.rules()
	for _, r := range rules {
		rt := c.rates[r.Identity]
		if rt == nil {
			rt = &demand.Rates{}
			c.rates[r.Identity] = rt
		}
		rt.Update(r.Offered, r.Admitted, now, c.set.Interval/tauDivisor)
		if r.PerValue {
			c.meterValues(r, now)
		}
	}
	var report *demand.Report
	if c.st != nil {
		if gen, _ := c.st.Session(); gen != c.sessGen {
			// A new session: the old one's report is gone with it.
			c.sessGen = gen
			c.hist.Reset()
			c.last = nil
		}
		report = c.due(rules, now)
	}
	c.mu.Unlock()
	if report != nil {
		c.write(ctx, report, now)
	}
	c.apply(now)
}
