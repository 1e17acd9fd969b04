package config

import (
	"io"
	"slices"
	"strings"
	"testing"
)

// What a container's environment holds that nobody set for sharelimit:
// Kubernetes' service links, upstream's lenient LOG_FORMAT, and listener
// addresses that name one port two ways.

// sidecarEnv is what a plain sharelimit sidecar sets: its own variables only.
var sidecarEnv = []string{"PATH=/usr/bin:/bin", "SHARELIMIT_CONFIG_DIR=/etc/sharelimit/config"}

// TestServiceLinkKeepsSidecarOnLoopback: Kubernetes injects
// <SERVICE>_PORT=tcp://IP:PORT into every pod of a namespace for every
// Service in it (enableServiceLinks defaults to true). A Service named
// "statsd" (a statsd-exporter, very common) makes STATSD_PORT, one of the
// exact names upstreamBy treats as proof of upstream's deployment. A
// sidecar that sets only SHARELIMIT_* variables then listens on 0.0.0.0
// (gRPC, admin and a new pprof port 6070) and reports fault=unshared.
func TestServiceLinkKeepsSidecarOnLoopback(t *testing.T) {
	env := append(append([]string{}, sidecarEnv...),
		"STATSD_SERVICE_HOST=10.96.3.4", "STATSD_SERVICE_PORT=9125",
		"STATSD_PORT=tcp://10.96.3.4:9125", "STATSD_PORT_9125_UDP=udp://10.96.3.4:9125")
	c, err := ParseEnviron("serve", nil, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.UpstreamBy) > 0 || c.GRPCAddr != "127.0.0.1:8081" || c.HTTPAddr != "127.0.0.1:8080" || c.DebugAddr != "" {
		t.Errorf("a Kubernetes service link put a sidecar in upstream's mode: UpstreamBy=%v grpc=%s http=%s debug=%q allow-remote=%v",
			c.UpstreamBy, c.GRPCAddr, c.HTTPAddr, c.DebugAddr, c.AllowRemote)
	}
}

// TestServiceLinkPortDoesNotStopSidecar: a Service named grpc or debug in
// the namespace gives every pod GRPC_PORT / DEBUG_PORT = tcp://IP:PORT. A
// sidecar that never set an upstream variable refuses to start.
func TestServiceLinkPortDoesNotStopSidecar(t *testing.T) {
	for _, kv := range []string{"GRPC_PORT=tcp://10.96.0.5:8081", "DEBUG_PORT=tcp://10.96.0.6:6070"} {
		env := append(append([]string{}, sidecarEnv...), kv, strings.SplitN(kv, "_", 2)[0]+"_SERVICE_HOST=10.96.0.5")
		if _, err := ParseEnviron("serve", nil, env, io.Discard); err != nil {
			t.Errorf("%s (a Kubernetes service link) stops a sidecar: %v", kv, err)
		}
	}
}

// TestLogFormatAsUpstreamReadsIt: upstream switches to JSON when
// strings.ToLower(LOG_FORMAT) == "json" and logs text for any other value;
// it never refuses one. Here anything but text or json stops the daemon.
func TestLogFormatAsUpstreamReadsIt(t *testing.T) {
	for _, v := range []string{"logfmt", "plain", "console", "TEXT "} {
		env := append(append([]string{}, sidecarEnv...), "RUNTIME_ROOT=/srv/runtime_data/current", "LOG_FORMAT="+v)
		if _, err := ParseEnviron("serve", nil, env, io.Discard); err != nil {
			t.Errorf("LOG_FORMAT=%q, which upstream runs with (as text), stops the daemon: %v", v, err)
		}
	}
}

// TestValidateSamePortSpelledTwoWays: Validate's clash check
// compares address strings, so two listeners on one port spelled two ways
// pass it and the start fails later with "bind: address already in use",
// which reads like another process holding the port.
func TestValidateSamePortSpelledTwoWays(t *testing.T) {
	for _, tc := range []struct{ http, metrics string }{
		{"0.0.0.0:8080", ":8080"},            // upstream's mode + PROMETHEUS_ADDR=:8080
		{"127.0.0.1:8080", "localhost:8080"}, // sidecar + SHARELIMIT_METRICS_ADDR=localhost:8080
	} {
		c := Defaults()
		c.ConfigDir = t.TempDir()
		c.AllowRemote = true
		c.HTTPAddr, c.MetricsAddr = tc.http, tc.metrics
		if err := c.Validate(); err == nil {
			t.Errorf("--http-addr %s and --metrics-addr %s share port 8080, and Validate accepts it", tc.http, tc.metrics)
		}
	}
}

// TestServiceLinksAreNotUpstreams: every variable of a Service's links is
// read as unset, so none is named as ignored, and upstream's own variables
// set beside them still apply.
func TestServiceLinksAreNotUpstreams(t *testing.T) {
	env := append(append([]string{}, sidecarEnv...),
		"REDIS_SERVICE_HOST=10.96.12.7", "REDIS_SERVICE_PORT=6379", "REDIS_SERVICE_PORT_REDIS=6379", "REDIS_PORT=tcp://10.96.12.7:6379",
		"REDIS_PORT_6379_TCP=tcp://10.96.12.7:6379", "REDIS_PORT_6379_TCP_PROTO=tcp", "REDIS_PORT_6379_TCP_PORT=6379", "REDIS_PORT_6379_TCP_ADDR=10.96.12.7",
		"GRPC_SERVICE_HOST=10.96.0.5", "GRPC_PORT=tcp://10.96.0.5:8081")
	c, err := ParseEnviron("serve", nil, env, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.UpstreamBy) > 0 || len(c.Notices) > 0 || c.GRPCAddr != "127.0.0.1:8081" {
		t.Fatalf("service links: UpstreamBy=%v grpc=%s notices:\n%s", c.UpstreamBy, c.GRPCAddr, renderNotices(c.Notices))
	}
	// Upstream's REDIS_URL beside them is upstream's, and GRPC_PORT with a
	// number is a port, whatever Service exists.
	c, err = ParseEnviron("serve", nil, append(env[:len(env):len(env)], "REDIS_URL=redis:6379"), io.Discard)
	if err != nil || !slices.Equal(c.UpstreamBy, []string{"REDIS_URL"}) || c.GRPCAddr != "0.0.0.0:8081" {
		t.Fatalf("REDIS_URL beside service links: %v, UpstreamBy=%v grpc=%s", err, c.UpstreamBy, c.GRPCAddr)
	}
	c, err = ParseEnviron("serve", nil, []string{"GRPC_SERVICE_HOST=10.96.0.5", "GRPC_PORT=9081"}, io.Discard)
	if err != nil || c.GRPCAddr != "0.0.0.0:9081" {
		t.Fatalf("GRPC_PORT=9081 beside GRPC_SERVICE_HOST: %v, grpc=%s", err, c.GRPCAddr)
	}
}

// TestDockerLinksAreNotUpstreams: Docker's legacy --link gives
// <ALIAS>_PORT=tcp://ip:port without a _SERVICE_HOST; read as unset, as a
// Kubernetes service link is.
func TestDockerLinksAreNotUpstreams(t *testing.T) {
	for _, environ := range [][]string{
		{"STATSD_PORT=tcp://172.17.0.2:8125", "STATSD_PORT_8125_TCP=tcp://172.17.0.2:8125", "STATSD_NAME=/rl/statsd"},
		{"DEBUG_PORT=tcp://172.17.0.3:6070", "DEBUG_NAME=/rl/debug"},
		{"GRPC_PORT=udp://172.17.0.4:8081"},
	} {
		c, err := ParseEnviron("serve", nil, environ, io.Discard)
		if err != nil {
			t.Fatalf("%v: %v", environ, err)
		}
		if len(c.UpstreamBy) > 0 || c.GRPCAddr != "127.0.0.1:8081" || c.DebugAddr != "" {
			t.Errorf("%v: UpstreamBy=%v grpc=%s debug=%q", environ, c.UpstreamBy, c.GRPCAddr, c.DebugAddr)
		}
	}
}
