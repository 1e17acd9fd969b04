package examples_test

import (
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	upstreamhttpv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"gopkg.in/yaml.v3"
)

const (
	rateLimitFilterType = "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit"
	routerFilterType    = "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"
	hcmType             = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
	httpOptionsKey      = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"
)

// envoyWant is what a bootstrap must agree with: the sharelimit it talks to.
type envoyWant struct {
	grpcAddr  string // the sidecar's --grpc-addr
	configDir string // the descriptors the sidecar loads (a repository path)
	replicas  int    // for explain's figures only
}

// envoyListener is one listener of a parsed bootstrap.
type envoyListener struct {
	name      string
	addr      string // host:port
	port      int
	hcm       *hcmv3.HttpConnectionManager
	rateLimit *ratelimitv3.RateLimit // nil when the listener does not ask sharelimit
}

// envoyConfig is a parsed, schema-checked bootstrap.
type envoyConfig struct {
	listeners []envoyListener
	clusters  map[string]*clusterv3.Cluster
}

// parseEnvoy reads a YAML bootstrap strictly: every field and every typed
// config must exist in Envoy's API, and pass the API's validation rules, the
// typed configs' own included (validateEnvoyMessage).
func parseEnvoy(p *problems, where string, data []byte) *envoyConfig {
	var doc any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		p.addf("%s: %v", where, err)
		return nil
	}
	js, err := json.Marshal(doc)
	if err != nil {
		p.addf("%s: %v", where, err)
		return nil
	}
	var bs bootstrapv3.Bootstrap
	if err := protojson.Unmarshal(js, &bs); err != nil {
		p.addf("%s: not a valid Envoy v3 bootstrap: %v", where, err)
		return nil
	}
	validateEnvoyMessage(p, where, &bs)
	if a := bs.GetAdmin().GetAddress().GetSocketAddress(); a != nil && !isLoopbackAddr(net.JoinHostPort(a.GetAddress(), "0")) {
		p.addf("%s: the admin interface listens on %s: it can stop Envoy and must stay on loopback", where, a.GetAddress())
	}
	ec := &envoyConfig{clusters: map[string]*clusterv3.Cluster{}}
	for _, c := range bs.GetStaticResources().GetClusters() {
		ec.clusters[c.GetName()] = c
		for key, opt := range c.GetTypedExtensionProtocolOptions() {
			if key == httpOptionsKey {
				var hpo upstreamhttpv3.HttpProtocolOptions
				if err := opt.UnmarshalTo(&hpo); err != nil {
					p.addf("%s: cluster %s: %s: %v", where, c.GetName(), key, err)
				}
			}
		}
	}
	for _, l := range bs.GetStaticResources().GetListeners() {
		sa := l.GetAddress().GetSocketAddress()
		el := envoyListener{name: l.GetName(), port: int(sa.GetPortValue()),
			addr: net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue())))}
		for _, fc := range l.GetFilterChains() {
			for _, f := range fc.GetFilters() {
				if f.GetTypedConfig().GetTypeUrl() != hcmType {
					continue
				}
				var hcm hcmv3.HttpConnectionManager
				if err := f.GetTypedConfig().UnmarshalTo(&hcm); err != nil {
					p.addf("%s: listener %s: %v", where, l.GetName(), err)
					continue
				}
				el.hcm = &hcm
				filters := hcm.GetHttpFilters()
				if len(filters) == 0 || filters[len(filters)-1].GetTypedConfig().GetTypeUrl() != routerFilterType {
					p.addf("%s: listener %s: the router must be the last HTTP filter", where, l.GetName())
				}
				for _, hf := range filters {
					if hf.GetTypedConfig().GetTypeUrl() != rateLimitFilterType {
						continue
					}
					var rl ratelimitv3.RateLimit
					if err := hf.GetTypedConfig().UnmarshalTo(&rl); err != nil {
						p.addf("%s: listener %s: %v", where, l.GetName(), err)
						continue
					}
					el.rateLimit = &rl
				}
			}
		}
		ec.listeners = append(ec.listeners, el)
	}
	return ec
}

// endpoints lists a static cluster's addresses: host:port, or unix:path for a
// pipe.
func (ec *envoyConfig) endpoints(cluster string) []string {
	var out []string
	for _, le := range ec.clusters[cluster].GetLoadAssignment().GetEndpoints() {
		for _, lb := range le.GetLbEndpoints() {
			a := lb.GetEndpoint().GetAddress()
			if pipe := a.GetPipe(); pipe != nil {
				out = append(out, "unix:"+pipe.GetPath())
				continue
			}
			sa := a.GetSocketAddress()
			out = append(out, net.JoinHostPort(sa.GetAddress(), strconv.Itoa(int(sa.GetPortValue()))))
		}
	}
	return out
}

// listener returns the listener on a port.
func (ec *envoyConfig) listener(port int) *envoyListener {
	for i := range ec.listeners {
		if ec.listeners[i].port == port {
			return &ec.listeners[i]
		}
	}
	return nil
}

// route returns the route a request for path takes on a listener (the first
// virtual host that serves every domain), as Envoy picks it: the first match.
func (l *envoyListener) route(path string) *routev3.Route {
	for _, vh := range l.hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			m := r.GetMatch()
			switch {
			case m.GetPath() != "" && m.GetPath() == path,
				m.GetPrefix() != "" && strings.HasPrefix(path, m.GetPrefix()):
				return r
			}
		}
	}
	return nil
}

// checkEnvoy checks a bootstrap against the sharelimit beside it: the
// rate-limit filter reaches the sidecar's gRPC address over HTTP/2 with the v3
// API, its domain exists, and every descriptor the route actions can produce
// is limited by a rule (checked with `sharelimit explain`).
func checkEnvoy(p *problems, where string, data []byte, want envoyWant) *envoyConfig {
	ec := parseEnvoy(p, where, data)
	if ec == nil {
		return nil
	}
	asking := 0
	for _, l := range ec.listeners {
		if l.hcm == nil {
			continue
		}
		if l.hcm.GetRouteConfig() == nil {
			p.addf("%s: listener %s: routes must be inline (route_config) for this check", where, l.name)
			continue
		}
		checkRouteClusters(p, where, ec, l)
		if l.rateLimit == nil {
			if limits := rateLimits(l.hcm); len(limits) > 0 {
				p.addf("%s: listener %s has rate_limits on its routes but no %s filter: nothing asks sharelimit", where, l.name, "envoy.filters.http.ratelimit")
			}
			continue
		}
		asking++
		checkRateLimitFilter(p, where, ec, l, want)
	}
	if asking == 0 {
		p.addf("%s: no listener has the envoy.filters.http.ratelimit filter", where)
	}
	return ec
}

// checkRouteClusters checks that every route of a listener goes to a cluster
// that exists.
func checkRouteClusters(p *problems, where string, ec *envoyConfig, l envoyListener) {
	for _, vh := range l.hcm.GetRouteConfig().GetVirtualHosts() {
		for _, r := range vh.GetRoutes() {
			if c := r.GetRoute().GetCluster(); c != "" && ec.clusters[c] == nil {
				p.addf("%s: listener %s: route %s goes to cluster %q, which does not exist", where, l.name, r.GetMatch(), c)
			}
		}
	}
}

// rateLimits gathers the rate_limits of every virtual host and route.
func rateLimits(hcm *hcmv3.HttpConnectionManager) []*routev3.RateLimit {
	var out []*routev3.RateLimit
	for _, vh := range hcm.GetRouteConfig().GetVirtualHosts() {
		out = append(out, vh.GetRateLimits()...)
		for _, r := range vh.GetRoutes() {
			out = append(out, r.GetRoute().GetRateLimits()...)
		}
	}
	return out
}

func checkRateLimitFilter(p *problems, where string, ec *envoyConfig, l envoyListener, want envoyWant) {
	rl := l.rateLimit
	where = fmt.Sprintf("%s: listener %s", where, l.name)
	svc := rl.GetRateLimitService()
	if svc.GetTransportApiVersion() != corev3.ApiVersion_V3 {
		p.addf("%s: rate_limit_service.transport_api_version is %v; sharelimit serves only the v3 API", where, svc.GetTransportApiVersion())
	}
	name := svc.GetGrpcService().GetEnvoyGrpc().GetClusterName()
	c := ec.clusters[name]
	switch {
	case name == "":
		p.addf("%s: rate_limit_service must use envoy_grpc with a cluster", where)
	case c == nil:
		p.addf("%s: rate_limit_service cluster %q does not exist", where, name)
	default:
		if eps := ec.endpoints(name); len(eps) != 1 || eps[0] != want.grpcAddr {
			p.addf("%s: cluster %s points at %v, but sharelimit listens on --grpc-addr %s", where, name, eps, want.grpcAddr)
		}
		if !http2(c) {
			p.addf("%s: cluster %s must speak HTTP/2 (gRPC): set typed_extension_protocol_options %s explicit_http_config.http2_protocol_options", where, name, httpOptionsKey)
		}
	}
	if rl.GetDomain() == "" {
		p.addf("%s: the rate-limit filter has no domain", where)
		return
	}
	sent := 0
	for _, lim := range rateLimits(l.hcm) {
		if lim.GetStage().GetValue() != rl.GetStage() {
			continue // another filter's stage
		}
		entries, err := descriptorEntries(lim)
		if err != nil {
			p.addf("%s: %v", where, err)
			continue
		}
		sent++
		limited, out, err := explain(want.configDir, rl.GetDomain(), want.replicas, entries)
		switch {
		case err != nil:
			p.addf("%s: %v", where, err)
		case !limited:
			p.addf("%s: the descriptor %v (domain %s) matches no rule in %s:\n%s", where, entries, rl.GetDomain(), want.configDir, out)
		}
	}
	if sent == 0 {
		p.addf("%s: no route produces a descriptor for the rate-limit filter's stage %d", where, rl.GetStage())
	}
}

// http2 reports whether a cluster speaks HTTP/2 to its upstream.
func http2(c *clusterv3.Cluster) bool {
	opt := c.GetTypedExtensionProtocolOptions()[httpOptionsKey]
	if opt == nil {
		return c.GetHttp2ProtocolOptions() != nil
	}
	var hpo upstreamhttpv3.HttpProtocolOptions
	if err := opt.UnmarshalTo(&hpo); err != nil {
		return false
	}
	return hpo.GetExplicitHttpConfig().GetHttp2ProtocolOptions() != nil
}

// descriptorEntries is the descriptor Envoy builds from one rate_limits entry,
// as key=value arguments for `sharelimit explain`. Request-dependent values
// (the client's address, a header) get a sample value, which a key-only rule
// matches as it would match any.
func descriptorEntries(lim *routev3.RateLimit) ([]string, error) {
	var out []string
	for _, a := range lim.GetActions() {
		var k, v string
		switch {
		case a.GetRemoteAddress() != nil:
			k, v = "remote_address", "192.0.2.10"
		case a.GetMaskedRemoteAddress() != nil:
			k, v = "masked_remote_address", "192.0.2.0/24"
		case a.GetGenericKey() != nil:
			k, v = a.GetGenericKey().GetDescriptorKey(), a.GetGenericKey().GetDescriptorValue()
			if k == "" {
				k = "generic_key"
			}
		case a.GetHeaderValueMatch() != nil:
			k, v = a.GetHeaderValueMatch().GetDescriptorKey(), a.GetHeaderValueMatch().GetDescriptorValue()
			if k == "" {
				k = "header_match"
			}
		case a.GetQueryParameterValueMatch() != nil:
			k, v = a.GetQueryParameterValueMatch().GetDescriptorKey(), a.GetQueryParameterValueMatch().GetDescriptorValue()
			if k == "" {
				k = "query_match"
			}
		case a.GetRequestHeaders() != nil:
			k, v = a.GetRequestHeaders().GetDescriptorKey(), "sample"
		default:
			return nil, fmt.Errorf("rate_limits action %v: this guard does not know what descriptor entry it produces; teach descriptorEntries", a)
		}
		out = append(out, k+"="+v)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("a rate_limits entry with no actions")
	}
	return out, nil
}

// TestEnvoyBootstrap checks examples/envoy/envoy.yaml on its own, against the
// daemon's default --grpc-addr and the example descriptors. (The compose test
// checks it again against the sidecar it is deployed with.)
func TestEnvoyBootstrap(t *testing.T) {
	t.Parallel()
	var p problems
	defaults := checkDaemon(&p, daemon{where: "defaults", notDeployed: true, mounts: map[string]string{"/etc/sharelimit/config": repo + "/examples/config"}})
	if defaults == nil {
		p.report(t)
		return
	}
	ec := checkEnvoy(&p, "examples/envoy/envoy.yaml", readFile(t, "examples/envoy/envoy.yaml"),
		envoyWant{grpcAddr: defaults.GRPCAddr, configDir: repo + "/examples/config", replicas: 3})
	if ec != nil {
		for _, want := range []struct {
			name string
			ok   bool
		}{
			{"an ingress listener on 0.0.0.0:10000 asks sharelimit", ec.listener(10000) != nil && ec.listener(10000).rateLimit != nil && ec.listener(10000).addr == "0.0.0.0:10000"},
			{"the app cluster is the upstream on 127.0.0.1:80", len(ec.endpoints("app")) == 1 && ec.endpoints("app")[0] == "127.0.0.1:80"},
		} {
			if !want.ok {
				p.addf("examples/envoy/envoy.yaml: want %s", want.name)
			}
		}
		if l := ec.listener(10000); l != nil && l.rateLimit != nil {
			if l.rateLimit.GetFailureModeDeny() {
				p.addf("examples/envoy/envoy.yaml: failure_mode_deny: true turns a sidecar restart into an outage; the example fails open")
			}
			if !proto.Equal(l.rateLimit.GetTimeout(), durationpb.New(20*time.Millisecond)) {
				p.addf("examples/envoy/envoy.yaml: timeout %v, want Envoy's default 0.02s spelled out", l.rateLimit.GetTimeout().AsDuration())
			}
			if l.rateLimit.GetEnableXRatelimitHeaders() != ratelimitv3.RateLimit_DRAFT_VERSION_03 {
				p.addf("examples/envoy/envoy.yaml: want enable_x_ratelimit_headers: DRAFT_VERSION_03")
			}
		}
	}
	p.report(t)
}
