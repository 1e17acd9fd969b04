package daemon

import (
	"context"
	"strconv"
	"time"

	"github.com/sharelimit/sharelimit/server"
)

// The status page draws each rule's last ten minutes. The daemon runs the
// sampler that fills them and tells the page of the moments worth a line:
// reloads and membership changes. (A share moved by demand shows in the
// slots themselves.)

// history samples the per-rule counters for the status page every
// server.HistoryStep, off the request path, until ctx ends.
func (d *Daemon) history(ctx context.Context) error {
	t := time.NewTicker(server.HistoryStep)
	defer t.Stop()
	return d.admin.RunHistory(ctx, t.C)
}

// markReload marks a config put in force.
func (d *Daemon) markReload(rules *installer) {
	d.admin.Mark(server.MarkReload, "generation "+strconv.Itoa(rules.Status().Generation))
}

// markMembership has every view mark its changes of weight from now on.
func (d *Daemon) markMembership() {
	for _, v := range d.views {
		v.marks.Store(d.admin)
	}
}
