package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/consul/api"
)

// Defaults for the zero fields of ConsulConfig.
const (
	// DefaultQueryRate is the sustained number of catalog requests per second
	// one replica may make. A blocking query returns as soon as the catalog
	// changes, so without pacing a catalog that changes 100 times a second would
	// cost every replica 100 requests a second. At 2/s a count change still
	// reaches the view within half a second even under constant churn, and a
	// thousand replicas cost Consul at most 2,000 stale reads a second while
	// the catalog churns and about 17 a second while it is quiet.
	DefaultQueryRate = 2.0
	// DefaultQueryBurst is how many requests may go back to back after a quiet
	// spell, so the first few changes of a rolling restart propagate at once.
	DefaultQueryBurst = 3
	// DefaultWaitTime is how long Consul holds a blocking query open when
	// nothing changes. It is shorter than Consul's own 5-minute default so that
	// a healthy watch confirms its view (and so refreshes ObservedAt) at least
	// once a minute, and a connection silently dropped by a middlebox is noticed
	// within about a minute.
	DefaultWaitTime = time.Minute
	// DefaultBackoffBase and DefaultBackoffMax shape the wait after a failed
	// request: full jitter over an exponential ceiling (0.5 s, 1 s, 2 s, ...,
	// 30 s), reset by the next success.
	DefaultBackoffBase = 500 * time.Millisecond
	DefaultBackoffMax  = 30 * time.Second
	// DefaultMaxInstances is the largest passing-instance count believed. A
	// larger answer (a mistyped filter matching every service, a misbehaving
	// proxy) would shrink every share to almost nothing, so it is treated as an
	// error and the last view stands.
	DefaultMaxInstances = 10_000

	// requestSlack is added to a blocking query's wait, on top of the up to
	// wait/16 that Consul adds itself, before the client gives up on it.
	requestSlack = 5 * time.Second
	// maxWaitTime is Consul's own cap on a blocking query's wait.
	maxWaitTime = 10 * time.Minute
	// maxErrorLen bounds LastError: a proxy's HTML error page is no log line.
	maxErrorLen = 512
)

// ErrRunning is returned by a second call of Consul.Run.
var ErrRunning = errors.New("run consul membership watch: already running")

// errTooMany marks an answer with more passing instances than MaxInstances.
var errTooMany = errors.New("more passing instances than believable")

// ConsulConfig configures a Consul source. The zero value of every field but
// Service is usable; the daemon sets Stale.
type ConsulConfig struct {
	Service    string // --consul-service: the service whose passing instances share each limit
	Filter     string // --consul-filter: a Consul filter expression applied to the entries
	Datacenter string // --consul-datacenter: "" is the agent's own datacenter
	// Node is the Consul node whose instances are this replica's (--node). ""
	// means the local agent's node name, read from /v1/agent/self (which needs
	// agent:read); until it answers, the Replicas view stands.
	Node string
	// Stale allows any Consul server to answer, not only the leader, so the
	// count survives the loss of a leader (--consul-stale).
	Stale bool
	// Replicas is the replica count assumed until Consul first answers
	// (--replicas); below 1 means 1.
	Replicas int
	// QueryRate caps requests to Consul per second, sustained (a token bucket
	// of QueryBurst tokens). Default DefaultQueryRate.
	QueryRate float64
	// QueryBurst is the token bucket's size. Default DefaultQueryBurst.
	QueryBurst int
	// WaitTime is how long Consul may hold a blocking query open; at most 10
	// minutes. Default DefaultWaitTime.
	WaitTime time.Duration
	// RequestTimeout is the client-side deadline of every request, so a server
	// that never answers cannot wedge the watch. It must exceed WaitTime plus
	// the WaitTime/16 of jitter Consul adds. Default WaitTime + WaitTime/16 + 5 s.
	RequestTimeout time.Duration
	// BackoffBase and BackoffMax shape the wait after an error: a random
	// duration in [0, min(BackoffMax, BackoffBase·2^n)) after the n-th
	// consecutive failure. Defaults DefaultBackoffBase and DefaultBackoffMax.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// MaxInstances is the largest passing-instance count accepted; a larger
	// answer is an error and the last view stands. Default DefaultMaxInstances.
	MaxInstances int
	// Token is the ACL token the client sends, if any. It is used only to scrub
	// the token from error messages and logs, should a server or proxy echo it
	// back. api.NewClient stores the token it resolved (CONSUL_HTTP_TOKEN or
	// CONSUL_HTTP_TOKEN_FILE) in the api.Config it was given, so pass that
	// config's Token after creating the client.
	Token string
	// Logger receives view changes at info, errors at warn and every poll at
	// debug. The caller tags it (component=membership). nil discards.
	Logger *slog.Logger
	// OnUpdate, if set, receives every published View, from Run's goroutine:
	// after every answer from Consul (at most QueryRate a second, and at least
	// once per WaitTime while Consul is healthy) and after every failure. It
	// must return quickly; compare Weight to act only on changes.
	OnUpdate func(View)
	// Clock stamps ObservedAt. nil means time.Now. Pacing and back-off always
	// use real timers.
	Clock func() time.Time
}

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
	running atomic.Bool
	// count is countPassing. Tests swap it, before Run, for a counter that
	// gives what no answer from Consul can, to reach the faults behind it.
	count func(entries []*api.ServiceEntry, node string) (total, local int)

	// Only Run's goroutine touches these.
	answered bool // Consul has answered at least once
	index    uint64
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
	c := &Consul{cfg: cfg, client: client, log: cfg.Logger, now: cfg.Clock, count: countPassing}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	if c.now == nil {
		c.now = time.Now
	}
	v := replicasView("consul", cfg.Replicas)
	v.Node = cfg.Node
	c.view.Store(&v)
	return c, nil
}

// normalize checks cfg and fills in defaults, reporting every problem at once.
func (cfg *ConsulConfig) normalize() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if cfg.Service == "" {
		bad("service name is empty")
	}
	if cfg.QueryRate < 0 || math.IsNaN(cfg.QueryRate) || math.IsInf(cfg.QueryRate, 0) {
		bad("query rate %v is not a finite positive number", cfg.QueryRate)
	}
	if cfg.QueryBurst < 0 {
		bad("query burst %d is negative", cfg.QueryBurst)
	}
	if cfg.WaitTime < 0 || cfg.WaitTime > maxWaitTime {
		bad("wait time %s is outside (0, %s]", cfg.WaitTime, maxWaitTime)
	}
	if cfg.RequestTimeout < 0 {
		bad("request timeout %s is negative", cfg.RequestTimeout)
	}
	if cfg.BackoffBase < 0 || cfg.BackoffMax < 0 {
		bad("back-off %s..%s is negative", cfg.BackoffBase, cfg.BackoffMax)
	}
	if cfg.MaxInstances < 0 {
		bad("max instances %d is negative", cfg.MaxInstances)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	if cfg.QueryRate == 0 {
		cfg.QueryRate = DefaultQueryRate
	}
	if cfg.QueryBurst == 0 {
		cfg.QueryBurst = DefaultQueryBurst
	}
	if cfg.WaitTime == 0 {
		cfg.WaitTime = DefaultWaitTime
	}
	// Consul holds a blocking query for up to wait + wait/16.
	held := cfg.WaitTime + cfg.WaitTime/16
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = held + requestSlack
	} else if cfg.RequestTimeout <= held {
		return fmt.Errorf("request timeout %s does not exceed the %s Consul may hold a blocking query", cfg.RequestTimeout, held)
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = DefaultBackoffBase
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = max(DefaultBackoffMax, cfg.BackoffBase)
	}
	if cfg.BackoffMax < cfg.BackoffBase {
		return fmt.Errorf("back-off max %s is below its base %s", cfg.BackoffMax, cfg.BackoffBase)
	}
	if cfg.MaxInstances == 0 {
		cfg.MaxInstances = DefaultMaxInstances
	}
	return nil
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
		total, local, err := c.poll(ctx, node)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = c.observe(node, total, local)
		}
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

// poll makes one request for the passing instances and advances the index.
// With index 0 the request is non-blocking: Consul answers at once.
func (c *Consul) poll(ctx context.Context, node string) (total, local int, err error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	q := &api.QueryOptions{
		AllowStale: c.cfg.Stale,
		Filter:     c.cfg.Filter,
		Datacenter: c.cfg.Datacenter,
	}
	if c.index > 0 {
		q.WaitIndex = c.index
		q.WaitTime = c.cfg.WaitTime
	}
	entries, meta, err := c.client.Health().Service(c.cfg.Service, "", true, q.WithContext(ctx))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s: %w", c.cfg.RequestTimeout, context.DeadlineExceeded)
		}
		return 0, 0, fmt.Errorf("query passing instances of %q: %w", c.cfg.Service, err)
	}
	next := nextIndex(c.index, meta.LastIndex)
	if next == 0 && meta.LastIndex != 0 {
		c.log.Debug("consul membership: index went backwards; next query is non-blocking",
			"previous", c.index, "answered", meta.LastIndex)
	}
	c.index = next
	total, local = c.count(entries, node)
	if total == 0 {
		// No passing instance at all is what an emptied catalog looks like (a
		// restarted agent before re-registration, a filter matching nothing).
		// Counting ourselves in would let every replica enforce each limit
		// whole, N times the cap; tighter, never looser: the last view stands
		// and this is reported like any failed query.
		return 0, 0, fmt.Errorf("query passing instances of %q: none passing; the last view stands", c.cfg.Service)
	}
	if total > c.cfg.MaxInstances {
		return 0, 0, fmt.Errorf("query passing instances of %q: %d listed, limit %d: %w",
			c.cfg.Service, total, c.cfg.MaxInstances, errTooMany)
	}
	return total, local, nil
}

// nextIndex is the index to block on after an answer carrying got, following
// Consul's rules: an index that went backwards (a restored snapshot, another
// server's history) resets to 0, and 0 is never blocked on, so the next query
// is non-blocking and the token bucket alone paces it.
func nextIndex(prev, got uint64) uint64 {
	if got < prev {
		return 0
	}
	return got
}

// countPassing counts the passing entries, cluster-wide and on node. Consul
// already filtered on ?passing; the entries are checked again so that a proxy
// or filter that lets a failing instance through cannot inflate the count.
// Node names compare case-insensitively, as Consul's catalog does.
func countPassing(entries []*api.ServiceEntry, node string) (total, local int) {
	for _, e := range entries {
		if e == nil || e.Checks.AggregatedStatus() != api.HealthPassing {
			continue
		}
		total++
		if e.Node != nil && node != "" && strings.EqualFold(e.Node.Node, node) {
			local++
		}
	}
	return total, local
}

// agentNodeName asks the local agent for its node name.
func (c *Consul) agentNodeName(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	var self struct {
		Config struct{ NodeName string }
	}
	_, err := c.client.Raw().Query("/v1/agent/self", &self, (&api.QueryOptions{}).WithContext(ctx))
	if err == nil && self.Config.NodeName == "" {
		err = errors.New("the agent reported no node name")
	}
	if err != nil {
		return "", fmt.Errorf("resolve local node name from /v1/agent/self (or set the node explicitly): %w", err)
	}
	return self.Config.NodeName, nil
}

// observe publishes an answer from Consul, or returns an error, publishing
// nothing, when its counts cannot be a view: that answer is a fault and the
// last view stands.
func (c *Consul) observe(node string, total, local int) error {
	w, err := Weight(local, total)
	if err != nil {
		return fmt.Errorf("query passing instances of %q: %w; the last view stands", c.cfg.Service, err)
	}
	prev := c.view.Load()
	v := &View{
		Source:     "consul",
		Node:       node,
		Total:      total,
		Local:      local,
		Weight:     w,
		ObservedAt: c.now(),
		Errors:     prev.Errors,
	}
	first := !c.answered
	c.answered = true
	c.publish(v)

	if prev.LastError != "" {
		c.log.Info("consul membership: consul answers again", "errors", v.Errors)
	}
	switch {
	case !first && prev.Total == total && prev.Local == local:
		c.log.Debug("consul membership: view confirmed", "total", total, "local", local, "index", c.index)
	default:
		args := []any{"service", c.cfg.Service, "node", node, "total", total, "local", local, "weight", v.Weight}
		if !first {
			args = append(args, "previous_total", prev.Total, "previous_local", prev.Local)
		}
		if local == 0 {
			args = append(args, "note", "no passing instance on this node; this replica counts itself in")
		}
		c.log.Info("consul membership: view changed", args...)
	}
	return nil
}

// fail publishes an error: the view stands, only LastError and Errors change.
func (c *Consul) fail(ctx context.Context, err error, retryIn time.Duration) {
	prev := c.view.Load()
	v := *prev
	v.LastError = c.scrub(err.Error())
	v.Errors++
	c.publish(&v)
	level := slog.LevelDebug
	if v.LastError != prev.LastError {
		level = slog.LevelWarn
	}
	c.log.Log(ctx, level, "consul membership: watch failed; the last view stands",
		"error", v.LastError, "errors", v.Errors, "retry_in", retryIn.Round(time.Millisecond),
		"total", v.Total, "local", v.Local, "weight", v.Weight)
}

func (c *Consul) publish(v *View) {
	c.view.Store(v)
	if c.cfg.OnUpdate != nil {
		c.cfg.OnUpdate(*v)
	}
}

// scrub removes the ACL token from msg and bounds its length.
func (c *Consul) scrub(msg string) string {
	if c.cfg.Token != "" {
		msg = strings.ReplaceAll(msg, c.cfg.Token, "[redacted]")
	}
	if len(msg) > maxErrorLen {
		cut := maxErrorLen
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…(truncated)"
	}
	return msg
}
