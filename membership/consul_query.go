package membership

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/hashicorp/consul/api"
)

// errTooMany marks an answer with more passing instances than MaxInstances.
var errTooMany = errors.New("more passing instances than believable")

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
