package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/hashicorp/consul/api"
)

// maxErrorLen bounds LastError: a proxy's HTML error page is no log line.
const maxErrorLen = 512

// ageSlack is how far an answer's ObservedAt may fall before the view in
// force's and still count as no older: the agent sends Age in whole
// seconds, so two answers from one cache entry can be dated up to a second
// apart.
const ageSlack = time.Second

// errOlderAnswer marks an answer that the servers gave before the view in
// force (a cached answer, dated back by its Age), and that would loosen it.
var errOlderAnswer = errors.New("answer older than the view in force")

// observe publishes an answer from Consul, or returns an error, publishing
// nothing, when its counts cannot be a view: that answer is a fault and the
// last view stands.
func (c *Consul) observe(node string, a answer) error {
	w, err := weigh(a.tally)
	if err != nil {
		return fmt.Errorf("query passing instances of %q: %w; the last view stands", c.cfg.Service, err)
	}
	prev := c.view.Load()
	// A cached answer is as old as the cache's last refresh from the
	// servers: an agent that lost them keeps answering from its cache, and
	// the view's age must show it.
	observed := c.now().Add(-max(a.cacheAge, 0))
	if c.answered && w > prev.Weight && observed.Add(ageSlack).Before(prev.ObservedAt) {
		// The view in force came from the servers after this answer did
		// (the watch fell back to plain queries while the cache stopped
		// following them), so this answer says less about now than the
		// view does, and it would loosen it. A tighter older answer is
		// published: it loosens nothing.
		return fmt.Errorf("query passing instances of %q: observed %s before the view in force, at weight %v over %v: %w; the last view stands",
			c.cfg.Service, prev.ObservedAt.Sub(observed).Round(time.Second), w, prev.Weight, errOlderAnswer)
	}
	fault := ""
	if a.local == 0 {
		fault = FaultAbsent
	}
	v := &View{
		Fault:       fault,
		Source:      "consul",
		Node:        node,
		Total:       a.total,
		Local:       a.local,
		TotalWeight: a.totalWeight,
		LocalWeight: a.localWeight,
		Weight:      w,
		ObservedAt:  observed,
		Errors:      prev.Errors,
	}
	first := !c.answered
	c.answered = true
	c.nodes.Store(&a.nodes)
	c.publish(v)

	if prev.LastError != "" {
		c.log.Info("consul membership: consul answers again", "errors", v.Errors)
	}
	if v.Fault == FaultAbsent && (first || prev.Fault != FaultAbsent) {
		c.log.Warn("consul membership: this node has no counted instance of the service (not registered, or failing its checks for longer than --membership-grace): its peers leave this replica no share, so it admits next to nothing (one token per bucket) until its instance is registered and passes",
			"service", c.cfg.Service, "node", node, "total", v.Total)
	}
	same := prev.Total == v.Total && prev.Local == v.Local &&
		prev.TotalWeight == v.TotalWeight && prev.LocalWeight == v.LocalWeight
	switch {
	case !first && same:
		c.log.Debug("consul membership: view confirmed", "total", v.Total, "local", v.Local, "index", c.index,
			"cached", a.cached, "cache_hit", a.cacheHit, "cache_age", a.cacheAge)
	default:
		args := []any{"service", c.cfg.Service, "node", node, "total", v.Total, "local", v.Local, "weight", v.Weight}
		if v.TotalWeight != v.Total {
			args = append(args, "total_weight", v.TotalWeight, "local_weight", v.LocalWeight)
		}
		if !first {
			args = append(args, "previous_total", prev.Total, "previous_local", prev.Local)
		}
		c.log.Info("consul membership: view changed", args...)
	}
	return nil
}

// weigh is the share a tally gives: Weight of its summed weights. Its counts
// must make sense on their own (Weight's rules), and its weights must agree
// with them, every instance weighing at least 1; otherwise it is an error
// wrapping ErrImpossibleCount.
func weigh(t tally) (float64, error) {
	if _, err := Weight(t.local, t.total); err != nil {
		return 0, err
	}
	w, err := Weight(t.localWeight, t.totalWeight)
	if err != nil {
		return 0, fmt.Errorf("by weight: %w", err)
	}
	if t.localWeight < t.local || t.totalWeight-t.localWeight < t.total-t.local || (t.local == 0) != (t.localWeight == 0) {
		return 0, fmt.Errorf("weigh %d local of %d instances at weights %d of %d: an instance weighs at least 1: %w",
			t.local, t.total, t.localWeight, t.totalWeight, ErrImpossibleCount)
	}
	return w, nil
}

// fail publishes an error: the view stands, only LastError and Errors change.
func (c *Consul) fail(ctx context.Context, err error, retryIn time.Duration) {
	prev := c.view.Load()
	v := *prev
	v.LastError = c.scrub(err.Error())
	v.Errors++
	v.Fault = faultOf(err)
	c.publish(&v)
	level := slog.LevelDebug
	if v.LastError != prev.LastError {
		level = slog.LevelWarn
	}
	c.log.Log(ctx, level, "consul membership: watch failed; the last view stands",
		"error", v.LastError, "errors", v.Errors, "retry_in", retryIn.Round(time.Millisecond),
		"total", v.Total, "local", v.Local, "weight", v.Weight)
}

// faultOf names the fault behind a failed query.
func faultOf(err error) string {
	var se api.StatusError
	switch {
	case errors.Is(err, ErrACLFiltered):
		return FaultACLFiltered
	case errors.As(err, &se) && se.Code == 403:
		return FaultForbidden
	case errors.Is(err, ErrNonePassing):
		return FaultNonePassing
	case errors.Is(err, ErrSuspect):
		return FaultSuspect
	}
	return FaultError
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
	return scrubLen(msg)
}

// scrubLen bounds msg to maxErrorLen bytes, cut at a rune's start.
func scrubLen(msg string) string {
	if len(msg) > maxErrorLen {
		cut := maxErrorLen
		for cut > 0 && !utf8.RuneStart(msg[cut]) {
			cut--
		}
		msg = msg[:cut] + "…(truncated)"
	}
	return msg
}
