package daemon

import (
	"net"
	"net/http"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/server"
)

// The metrics listener (--metrics-addr, upstream's USE_PROMETHEUS and
// PROMETHEUS_ADDR): upstream's ratelimit_service_* series and every
// sharelimit_* series, at --metrics-path, and nothing else.

// metricsServer builds what serves the metrics listener, once it is open,
// and logs it at WARN when it is beyond loopback: upstream's default, :9090,
// is every interface.
func (d *Daemon) metricsServer(metrics *server.Metrics, rules *installer) *http.Server {
	if host, _, err := net.SplitHostPort(d.cfg.MetricsAddr); err == nil && !config.IsLoopback(host) {
		d.log.Warn("listening on a non-loopback address: anything that can reach it can read the rules' names and counts", "listener", "metrics", "addr", d.cfg.MetricsAddr)
	}
	h := metrics.UpstreamHandler(server.UpstreamOptions{
		Path: d.cfg.MetricsPath, Milliseconds: d.cfg.MetricsMilliseconds, ConfigLoads: rules.loads,
	})
	return &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
}

// loads reads the config loads so far: put in force, and refused.
func (in *installer) loads() (ok, failed float64) {
	read := func(result string) float64 {
		var m dto.Metric
		if err := in.reloads.WithLabelValues(result).Write(&m); err != nil {
			return 0
		}
		return m.GetCounter().GetValue()
	}
	return read("success"), read("failure")
}
