package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/hashicorp/consul/api"
)

// ErrRunning is returned by a second call of Consul.Run.
var ErrRunning = errors.New("run consul membership watch: already running")

// Consul is a membership source fed by Consul's health catalog: it watches
// /v1/health/service/<Service>?passing with blocking queries and publishes a
// View after every answer and every error.
//
// View is safe for concurrent use and never blocks. Run must be called once,
// by the owner of the source. Consul has no useful zero value; use NewConsul.
type Consul struct {
	cfg    ConsulConfig
	client *api.Client
	log    *slog.Logger
	now    func() time.Time

	view    atomic.Pointer[View]
	nodes   atomic.Pointer[[]string] // the passing nodes of the last answer observed
	running atomic.Bool
	// count is tallyCounted. Tests swap it, before Run, for a counter that
	// gives what no answer from Consul can, to reach the faults behind it.
	count func(entries []*api.ServiceEntry, node string) tally
	// cacheRetry is how long the watch sends plain queries after the
	// agent's cache failed where a plain query did not (see judgeCache).
	// Tests shorten it before Run.
	cacheRetry time.Duration

	// Only Run's goroutine touches these.
	answered bool // Consul has answered at least once
	index    uint64
	roster   roster // the instances counted (roster.go)
	started  time.Time
	// expect is the instance count of the view a state file saved (0
	// without one): the first answers are held to it (see poll).
	expect int
	// aclChecked are the instances (rosterKey, sorted) of the last cached
	// answer checked for ACL filtering with a plain query.
	aclChecked []string
	// The agent cache's standing (judgeCache): suspect after a cached query
	// the agent answered badly, struck when a plain query then answered,
	// down after cacheStrikes strikes, and skipped until plainUntil.
	suspect    bool
	strikes    int
	cacheDown  bool
	cacheErr   error
	plainUntil time.Time
	// Instances warned about for a weight below 1 (weigh), by node and ID.
	warned     map[string]struct{}
	warnedFull bool
}

// PassingNodes are the nodes with a passing instance in the last answer
// observed (before any damping), sorted; nil until Consul has answered. The
// caller must not modify them.
func (c *Consul) PassingNodes() []string {
	if p := c.nodes.Load(); p != nil {
		return *p
	}
	return nil
}

// NewConsul returns a Consul source that reads through client, which carries
// the address, TLS and token settings (build it from api.DefaultConfig so
// Consul's own environment variables apply). The source starts with the
// Replicas view and does nothing until Run.
func NewConsul(cfg ConsulConfig, client *api.Client) (*Consul, error) {
	if err := cfg.normalize(); err != nil {
		return nil, fmt.Errorf("new consul membership source: %w", err)
	}
	if client == nil {
		return nil, errors.New("new consul membership source: nil client")
	}
	c := &Consul{cfg: cfg, client: client, log: cfg.Logger, now: cfg.Clock, cacheRetry: cacheRetry}
	c.roster.grace = cfg.Grace
	c.count = c.tallyCounted
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.now == nil {
		c.now = time.Now
	}
	v := replicasView("consul", cfg.Replicas)
	if in := cfg.Initial; in != nil {
		if w, err := Weight(in.LocalWeight, in.TotalWeight); err == nil && in.Local <= in.Total && in.Local >= 0 && w == in.Weight {
			v = View{Source: "consul", Total: in.Total, Local: in.Local, TotalWeight: in.TotalWeight, LocalWeight: in.LocalWeight, Weight: w}
			c.expect = in.Total
		}
	}
	v.Node = cfg.Node
	c.view.Store(&v)
	return c, nil
}

// View returns the current view. It never blocks and is safe for concurrent
// use.
func (c *Consul) View() View { return *c.view.Load() }

// Run watches the catalog until ctx is done, then returns nil. Errors never
// end it: the last view stands while it retries. It returns ErrRunning if
// called again while, or after, it runs.
func (c *Consul) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	c.started = c.now()
	pace := newTokenBucket(c.cfg.QueryRate, c.cfg.QueryBurst)
	wait := func() bool { return sleep(ctx, pace.reserve(time.Now())) }
	failures := 0
	retry := func(err error) bool {
		d := backoff(failures, c.cfg.BackoffBase, c.cfg.BackoffMax, rand.Float64())
		failures++
		c.fail(ctx, err, d)
		return sleep(ctx, d)
	}

	node := c.cfg.Node
	for node == "" {
		if !wait() {
			return nil
		}
		name, err := c.agentNodeName(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			node = name
			c.log.Info("consul membership: local node resolved from agent", "node", node)
			break
		}
		if !retry(err) {
			return nil
		}
	}
	failures = 0

	for {
		if !wait() {
			return nil
		}
		cached := c.useCache(time.Now())
		a, err := c.poll(ctx, node, cached)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = c.observe(node, a)
		}
		// After observe, so that an answer the agent's cache gave but
		// observe refused (one older than the view in force) counts
		// against the cache as a failed query does.
		c.judgeCache(ctx, cached, err, time.Now())
		if err != nil {
			// The next request is non-blocking: after an error the index
			// may belong to another server's history (a restarted agent, a
			// restored snapshot), and blocking on it could hide the current
			// catalog for a whole WaitTime.
			c.index = 0
			if !retry(err) {
				return nil
			}
			continue
		}
		failures = 0
	}
}
