package membership

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"
)

// maxErrorLen bounds LastError: a proxy's HTML error page is no log line.
const maxErrorLen = 512

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
