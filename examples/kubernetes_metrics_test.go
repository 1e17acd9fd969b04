package examples_test

import (
	"net"
	"strconv"

	"github.com/sharelimit/sharelimit/config"
)

// The pod annotations most scrape configurations read: the kubernetes-pods
// job of the Prometheus Helm chart (prometheus-community/prometheus), and the
// many agents that copy it. The Prometheus Operator reads PodMonitors instead,
// which select a container port by name.
const (
	annScrape = "prometheus.io/scrape"
	annPort   = "prometheus.io/port"
	annPath   = "prometheus.io/path"
)

// checkScrape follows Prometheus to the sidecar's metrics: the pod is
// annotated for scraping, at a port the sidecar declares by name and
// listens on beyond loopback (--metrics-addr: the admin listener stays on
// loopback), at the path it serves (--metrics-path).
func checkScrape(p *problems, where string, ds *k8sDaemonSet, sidecar *k8sContainer, cfg *config.Config) {
	ann := ds.Spec.Template.Metadata.Annotations
	if ann[annScrape] != "true" {
		p.addf("%s: Prometheus has no way to reach /metrics: annotate the pod template %s: \"true\", with %s and %s", where, annScrape, annPort, annPath)
		return
	}
	if cfg.MetricsAddr == "" {
		p.addf("%s: no --metrics-addr: the admin listener is on loopback, so a scrape of the pod IP reaches no /metrics", where)
		return
	}
	host, port, err := net.SplitHostPort(cfg.MetricsAddr)
	if err != nil {
		p.addf("%s: --metrics-addr %q: %v", where, cfg.MetricsAddr, err)
		return
	}
	if host != "" && config.IsLoopback(host) {
		p.addf("%s: --metrics-addr %s is on loopback; Prometheus scrapes the pod IP", where, cfg.MetricsAddr)
	}
	if ann[annPort] != port {
		p.addf("%s: %s is %q, but --metrics-addr listens on port %s", where, annPort, ann[annPort], port)
	}
	named := false
	for _, cp := range sidecar.Ports {
		named = named || strconv.Itoa(cp.ContainerPort) == port && cp.Name != ""
	}
	if !named {
		p.addf("%s: the sharelimit container declares no named port %s: a PodMonitor selects the port by its name", where, port)
	}
	path := ann[annPath]
	if path == "" {
		path = "/metrics" // the annotation's default
	}
	if path != cfg.MetricsPath {
		p.addf("%s: %s is %q, but --metrics-path is %q", where, annPath, path, cfg.MetricsPath)
	}
}
