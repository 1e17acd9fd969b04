package daemon

import (
	"fmt"
	"net"

	"github.com/sharelimit/sharelimit/server"
)

// listen opens the gRPC, admin and (when asked for) debug listeners. If one
// fails, those already open are closed.
func (d *Daemon) listen() error {
	var err error
	if d.grpcLis, err = server.Listen(d.cfg.GRPCAddr); err != nil {
		return fmt.Errorf("gRPC listener: %w", err)
	}
	if d.httpLis, err = net.Listen("tcp", d.cfg.HTTPAddr); err != nil {
		d.closeListeners()
		return fmt.Errorf("admin listener: %w", err)
	}
	if d.cfg.LocalHTTPAddr != "" {
		if d.localLis, err = net.Listen("tcp", d.cfg.LocalHTTPAddr); err != nil {
			d.closeListeners()
			return fmt.Errorf("loopback admin listener: %w", err)
		}
	}
	if d.cfg.DebugAddr != "" {
		if d.debugLis, err = net.Listen("tcp", d.cfg.DebugAddr); err != nil {
			d.closeListeners()
			return fmt.Errorf("debug listener: %w", err)
		}
	}
	if d.cfg.MetricsAddr != "" {
		if d.metricsLis, err = net.Listen("tcp", d.cfg.MetricsAddr); err != nil {
			d.closeListeners()
			return fmt.Errorf("metrics listener: %w", err)
		}
	}
	return nil
}

// closeListeners closes every listener open, for a start that fails after
// listen: a daemon New does not return must leave nothing open.
func (d *Daemon) closeListeners() {
	for _, l := range []net.Listener{d.grpcLis, d.httpLis, d.localLis, d.debugLis, d.metricsLis} {
		if l != nil {
			l.Close()
		}
	}
}
