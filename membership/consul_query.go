package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

var (
	// ErrACLFiltered marks an answer Consul filtered by ACLs
	// (X-Consul-Results-Filtered-By-Acls): the token cannot read every
	// instance of the service, so the answer is not the cluster.
	ErrACLFiltered = errors.New("the answer was filtered by ACLs: the token cannot read every instance (it needs service:read on the service and node:read on every node, e.g. node_prefix \"\" { policy = \"read\" }); the last view stands")
	// ErrSuspect marks a first answer listing fewer instances than the
	// view in force expects.
	ErrSuspect = errors.New("suspect")
	// ErrNonePassing marks an answer with no passing instance at all.
	ErrNonePassing = errors.New("none passing")
	// errTooMany marks an answer with more passing instances than MaxInstances.
	errTooMany = errors.New("more passing instances than believable")
	// errTooHeavy marks an answer whose weights sum past maxTotalWeight.
	errTooHeavy = errors.New("summed weight larger than believable")
)

const (
	// maxTotalWeight is the largest summed weight believed. Up to it a
	// float64 holds every sum exactly, so a weighted share is as exact as a
	// counted one; past it the answer carries a weight no operator sets (a
	// proxy's garbage, an overflow), and the last view stands.
	maxTotalWeight = 1 << 53
	// maxWeightWarnings bounds how many instances with a weight below 1 are
	// remembered, so that each is warned about once: a catalog holds a few,
	// a garbage answer could name millions.
	maxWeightWarnings = 1024
)

// tally is what one answer says about the passing instances.
type tally struct {
	total, local int // passing instances, cluster-wide and on this node
	// totalWeight and localWeight are the same instances' summed weights;
	// each instance weighs at least 1.
	totalWeight, localWeight int
}

// answer is one successful query: its tally and how the agent served it.
type answer struct {
	tally
	nodes    []string      // the nodes with a passing instance, sorted
	cached   bool          // asked with ?cached
	cacheHit bool          // X-Cache: HIT
	cacheAge time.Duration // Age: how long ago the agent's cache was last refreshed from the servers
}

// poll makes one request for the passing instances and advances the index.
// With index 0 the request is non-blocking: Consul answers at once. With
// cached, the request asks for the agent's cache (?cached): see judgeCache.
func (c *Consul) poll(ctx context.Context, node string, cached bool) (answer, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	defer cancel()
	q := &api.QueryOptions{
		AllowStale: c.cfg.Stale,
		Filter:     c.cfg.Filter,
		Datacenter: c.cfg.Datacenter,
		// The agent answers a cached query from its cache, or from a view it
		// keeps current over one streaming subscription to the servers,
		// however many watchers ask. A blocking cached query follows the same
		// index rules as a plain one: the cache's index is the catalog's.
		UseCache: cached,
	}
	if c.index > 0 {
		q.WaitIndex = c.index
		q.WaitTime = c.cfg.WaitTime
		if d := c.roster.nextExpiry(c.now()); d > 0 && d < q.WaitTime {
			// An instance stops counting then: see it when it does.
			q.WaitTime = max(d, time.Millisecond)
		}
	}
	// Every instance, passing or not: the roster counts a registered
	// instance that does not pass yet, or no longer, for its grace.
	entries, meta, err := c.client.Health().Service(c.cfg.Service, "", false, q.WithContext(ctx))
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("no answer within %s: %w", c.cfg.RequestTimeout, context.DeadlineExceeded)
		}
		return answer{}, fmt.Errorf("query passing instances of %q: %w", c.cfg.Service, err)
	}
	next := nextIndex(c.index, meta.LastIndex)
	if next == 0 && meta.LastIndex != 0 {
		c.log.Debug("consul membership: index went backwards; next query is non-blocking",
			"previous", c.index, "answered", meta.LastIndex)
	}
	c.index = next
	filtered := meta.ResultsFilteredByACLs
	if cached && !filtered && meta.DefaultACLPolicy == "deny" && c.entriesChanged(entries) {
		// The agent's streaming backend does not say whether ACLs filtered
		// what it serves (no X-Consul-Results-Filtered-By-Acls): where ACLs
		// deny by default, a plain query, non-blocking, asks the servers,
		// each time the instances listed change.
		if filtered, err = c.aclFiltered(ctx); err != nil {
			return answer{}, fmt.Errorf("query instances of %q without the cache, to see whether ACLs filter them: %w", c.cfg.Service, err)
		}
	}
	if filtered {
		c.aclChecked = nil // and again on the next answer, however alike
		// The token may not read every instance (a node-identity token
		// reads only its own node): the answer lists only some replicas,
		// and each would enforce the whole of what it saw. A fault, not a
		// view.
		return answer{}, fmt.Errorf("query instances of %q: %w", c.cfg.Service, ErrACLFiltered)
	}
	listed := passingEntries(entries)
	if len(listed) == 0 {
		// No passing instance at all is what an emptied catalog looks like (a
		// restarted agent before re-registration, a filter matching nothing).
		// Counting ourselves in would let every replica enforce each limit
		// whole, N times the cap; tighter, never looser: the last view stands
		// and this is reported like any failed query.
		return answer{}, fmt.Errorf("query passing instances of %q: %w; the last view stands", c.cfg.Service, ErrNonePassing)
	}
	if expect := c.expect; !c.answered && len(entries) < expect && listsNode(entries, node) && c.now().Sub(c.started) < panicGraces*c.cfg.Grace {
		// A replica that starts has no memory of the catalog: were this
		// answer the truth, a catalog still partial (a Consul restarted
		// empty, re-registering) would be its first view, and it would
		// take a share its peers, who remember more, never left it. An
		// answer that lists this replica's node among fewer instances than
		// the view its state file saved is suspect, for as long as the
		// roster's panic threshold holds its memory. (One that does not
		// list it leaves it absent, which is tighter than any view.)
		return answer{}, fmt.Errorf("query passing instances of %q: %d listed, this node among them, fewer than the %d of the view the state file saved: %w; the last view stands",
			c.cfg.Service, len(entries), expect, ErrSuspect)
	}
	if len(entries) > c.cfg.MaxInstances {
		return answer{}, fmt.Errorf("query passing instances of %q: %d listed, limit %d: %w",
			c.cfg.Service, len(entries), c.cfg.MaxInstances, errTooMany)
	}
	a := answer{tally: c.count(entries, node), nodes: passingNodes(listed), cached: cached, cacheHit: meta.CacheHit, cacheAge: meta.CacheAge}
	if a.total > c.cfg.MaxInstances {
		// Counted past the limit with the instances remembered: the
		// roster's memory is bounded by it.
		return answer{}, fmt.Errorf("query passing instances of %q: %d counted, limit %d: %w",
			c.cfg.Service, a.total, c.cfg.MaxInstances, errTooMany)
	}
	if a.totalWeight > maxTotalWeight {
		return answer{}, fmt.Errorf("query passing instances of %q: weights sum past %d: %w",
			c.cfg.Service, int64(maxTotalWeight), errTooHeavy)
	}
	return a, nil
}

// entriesChanged reports whether entries list other instances than the last
// answer checked for ACL filtering did, and remembers them.
func (c *Consul) entriesChanged(entries []*api.ServiceEntry) bool {
	keys := make([]string, 0, len(entries))
	for _, e := range entries {
		if e != nil {
			k, _ := rosterKey(e)
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	if c.aclChecked != nil && slices.Equal(keys, c.aclChecked) {
		return false
	}
	c.aclChecked = keys
	return true
}

// aclFiltered asks the servers, without the agent's cache and without
// blocking, whether ACLs filter the service's instances for this token.
func (c *Consul) aclFiltered(ctx context.Context) (bool, error) {
	q := &api.QueryOptions{AllowStale: c.cfg.Stale, Filter: c.cfg.Filter, Datacenter: c.cfg.Datacenter}
	_, meta, err := c.client.Health().Service(c.cfg.Service, "", false, q.WithContext(ctx))
	if err != nil {
		c.aclChecked = nil // ask again next time
		return false, err
	}
	return meta.ResultsFilteredByACLs, nil
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

// tallyCounted is the Consul source's counter: the instances its roster
// counts, weighing each by its Weights.Passing unless weights are off.
func (c *Consul) tallyCounted(entries []*api.ServiceEntry, node string) tally {
	weigh := c.weigh
	if c.cfg.IgnoreWeights {
		weigh = nil
	}
	return c.roster.observe(entries, node, c.now(), weigh)
}

// weigh is an instance's weight, at least 1. An instance registered with a
// weight below 1 (a real agent stores 0 as 1, so this takes an old Consul,
// a proxy or a hand-made answer) counts 1: 0 would divide by zero when it is
// the only one, and would take this replica's share away when it is local.
// Each such instance is warned about once, however many answers list it.
func (c *Consul) weigh(e *api.ServiceEntry) int {
	w, ok := passingWeight(e)
	if ok {
		return w
	}
	var node, id string
	declared := 0
	if e.Node != nil {
		node = e.Node.Node
	}
	if e.Service != nil {
		id, declared = e.Service.ID, e.Service.Weights.Passing
	}
	key := node + "\x00" + id
	if _, done := c.warned[key]; done {
		return w
	}
	if len(c.warned) >= maxWeightWarnings {
		if !c.warnedFull {
			c.warnedFull = true
			c.log.Warn("consul membership: more instances with a weight below 1; they count 1 and are no longer named",
				"service", c.cfg.Service, "named", len(c.warned))
		}
		return w
	}
	if c.warned == nil {
		c.warned = make(map[string]struct{})
	}
	c.warned[key] = struct{}{}
	c.log.Warn("consul membership: instance weight below 1 counts as 1",
		"service", c.cfg.Service, "node", node, "service_id", id, "weight", declared)
	return w
}

// passingWeight is the weight an instance counts at, its Weights.Passing,
// and whether that was usable: one below 1, or an entry without a service,
// counts 1.
func passingWeight(e *api.ServiceEntry) (int, bool) {
	if e.Service == nil || e.Service.Weights.Passing < 1 {
		return 1, false
	}
	return e.Service.Weights.Passing, true
}

// addWeight adds w >= 1 to sum, stopping just past maxTotalWeight so that no
// sum overflows; poll refuses such an answer.
func addWeight(sum, w int) int {
	if w > maxTotalWeight+1-sum {
		return maxTotalWeight + 1
	}
	return sum + w
}

// judgeCache decides, after each query, whether the next one asks for the
// agent's cache.
//
// A cached query meets one failure a plain query does not: the agent cannot
// serve it from its cache. Consul 1.10+ serves ?cached health queries from
// a view fed by a streaming subscription to the servers, and an agent whose
// servers have streaming off (rpc.enable_streaming) answers every cached
// query 500 ("unknown service subscribe.StateChangeSubscription"), or, when
// the subscription dies silently, an empty list once the wait ends. So a
// cached query that the agent answered badly (an HTTP error, a body that
// does not decode, no passing instance, an answer older than the view a
// plain query gave and looser: see observe) makes the cache a suspect, and the
// next query goes without ?cached. If that one answers, the cache takes a
// strike, and the next query asks for it again. After cacheStrikes strikes
// in a row the watch sends plain blocking queries for cacheRetry, then tries
// the cache again. A plain query that fails too, or a cached one that
// answers, clears the strikes: the agent or the catalog was at fault, not
// the cache. Two strikes rather than one keep an agent that answered
// everything badly for a moment (a restart before its leader is known) from
// costing the cache ten minutes. A transport error (refused, reset, timed
// out) blames nothing: a plain query meets it too. Every attempt is one
// request, paced and backed off like any other, and counted in Errors when
// it fails.
//
// An agent without the cache (http_config.use_cache = false, or older than
// Consul 1.3) ignores ?cached and answers the plain blocking query, without
// X-Cache or Age headers. That needs no fall back, and cannot be told from a
// cache miss anyway: the api client reports a missing X-Cache as CacheHit
// false, like MISS.
func (c *Consul) judgeCache(ctx context.Context, cached bool, err error, now time.Time) {
	switch {
	case c.cfg.NoCache:
	case cached && err != nil:
		c.suspect = blamesCache(err)
		if c.suspect {
			c.cacheErr = err
		} else {
			c.strikes = 0
		}
	case cached:
		c.suspect, c.strikes = false, 0
		if c.cacheDown {
			c.cacheDown = false
			c.log.Info("consul membership: the agent cache answers again; cached queries from now on")
		}
	case c.suspect && err == nil:
		c.suspect = false
		c.strikes++
		if c.strikes < cacheStrikes {
			return
		}
		c.strikes = 0
		c.plainUntil = now.Add(c.cacheRetry)
		level := slog.LevelWarn
		if c.cacheDown {
			level = slog.LevelDebug // still failing after a retry: said already
		}
		c.cacheDown = true
		c.log.Log(ctx, level, "consul membership: the agent cannot serve cached queries; plain blocking queries until the next try",
			"error", c.scrub(c.cacheErr.Error()), "retry_in", c.cacheRetry)
	case c.suspect:
		c.suspect, c.strikes = false, 0
	}
}

// useCache reports whether the next query asks for the agent's cache.
func (c *Consul) useCache(now time.Time) bool {
	return !c.cfg.NoCache && !c.suspect && !now.Before(c.plainUntil)
}

// blamesCache reports whether a failed cached query makes the cache a
// suspect: whether the agent answered it, badly.
func blamesCache(err error) bool {
	var transport *url.Error
	return !errors.As(err, &transport) && !errors.Is(err, context.DeadlineExceeded) &&
		!errors.Is(err, context.Canceled) && !errors.Is(err, errTooMany) && !errors.Is(err, errTooHeavy)
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

// listsNode reports whether entries list an instance on node.
func listsNode(entries []*api.ServiceEntry, node string) bool {
	for _, e := range entries {
		if e != nil && e.Node != nil && node != "" && strings.EqualFold(e.Node.Node, node) {
			return true
		}
	}
	return false
}

// passingEntries are the entries listed passing.
func passingEntries(entries []*api.ServiceEntry) []*api.ServiceEntry {
	out := make([]*api.ServiceEntry, 0, len(entries))
	for _, e := range entries {
		if e != nil && e.Checks.AggregatedStatus() == api.HealthPassing {
			out = append(out, e)
		}
	}
	return out
}

// passingNodes are the distinct nodes of entries, sorted.
func passingNodes(entries []*api.ServiceEntry) []string {
	nodes := make([]string, 0, len(entries))
	for _, e := range entries {
		if e != nil && e.Node != nil {
			nodes = append(nodes, e.Node.Node)
		}
	}
	slices.Sort(nodes)
	return slices.Compact(nodes)
}
