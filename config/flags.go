package config

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// seconds is a duration flag that also takes a bare number of seconds, as
// operators write `--drain 5`.
type seconds struct{ d *time.Duration }

func (s seconds) String() string {
	if s.d == nil {
		return ""
	}
	return s.d.String()
}

func (s seconds) Set(v string) error {
	if n, err := strconv.ParseFloat(v, 64); err == nil {
		*s.d = time.Duration(n * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return fmt.Errorf("want a duration such as 5s, or seconds: %q", v)
	}
	*s.d = d
	return nil
}

// JoinRampAuto is --join-ramp auto: each rule ramps over its burst time,
// at most MaxAutoJoinRamp.
const JoinRampAuto time.Duration = -1

// MaxAutoJoinRamp caps --join-ramp auto.
const MaxAutoJoinRamp = 10 * time.Second

// joinRamp is --join-ramp: "auto" or a duration (seconds allowed).
type joinRamp struct{ d *time.Duration }

func (j joinRamp) String() string {
	if j.d == nil || *j.d == JoinRampAuto {
		return "auto"
	}
	return j.d.String()
}

func (j joinRamp) Set(v string) error {
	if strings.EqualFold(v, "auto") {
		*j.d = JoinRampAuto
		return nil
	}
	return seconds{j.d}.Set(v)
}

// upper is a string flag stored upper-case, so --config-type takes any case.
type upper struct{ s *string }

func (u upper) String() string {
	if u.s == nil {
		return ""
	}
	return *u.s
}

func (u upper) Set(v string) error {
	*u.s = strings.ToUpper(v)
	return nil
}

// FlagSet returns the serve flags bound to c, with their defaults. It is exported
// so documentation and tests can list exactly the flags that exist.
func (c *Config) FlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&c.GRPCAddr, "grpc-addr", "127.0.0.1:8081", "gRPC listen address (host:port, or unix:/path)")
	fs.StringVar(&c.HTTPAddr, "http-addr", "127.0.0.1:8080", "admin HTTP listen address: /healthcheck, /json, /rlconfig, /metrics, /debug/pprof/")
	fs.StringVar(&c.GRPCTransport, "grpc-transport", TransportDirect, "how the gRPC listener is served: direct (ShouldRateLimit on sharelimit's own HTTP/2 transport, other calls through grpc-go) or grpc-go (every call through grpc-go)")
	fs.BoolVar(&c.AllowRemote, "allow-remote", false, "allow listening on non-loopback addresses (logged as a warning)")
	fs.StringVar(&c.GRPCTLSCert, "grpc-tls-cert", "", "PEM certificate for gRPC TLS (with --grpc-tls-key)")
	fs.StringVar(&c.GRPCTLSKey, "grpc-tls-key", "", "PEM private key for gRPC TLS")
	fs.StringVar(&c.LocalHTTPAddr, "local-http-addr", "", "a loopback listener serving every admin page (status page, /rlconfig, /metrics, pprof), for an --http-addr beyond loopback, which serves other hosts only /healthcheck and /json; default then "+DefaultLocalHTTPAddr)
	fs.StringVar(&c.DebugAddr, "debug-addr", "", "a second admin listener (pprof, /rlconfig, ...), as upstream's debug port; empty = none")
	fs.StringVar(&c.MetricsAddr, "metrics-addr", "", "a listener that serves only metrics, at --metrics-path: upstream's ratelimit_service_* series and every sharelimit_* series (upstream's USE_PROMETHEUS); it may be beyond loopback without --allow-remote; empty = none")
	fs.StringVar(&c.MetricsPath, "metrics-path", "/metrics", "the path of --metrics-addr's metrics")
	fs.BoolVar(&c.MetricsMilliseconds, "metrics-response-time-ms", false, "report upstream's ratelimit_service_response_time_seconds in milliseconds, as upstream's PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS")
	fs.Float64Var(&c.NearLimitRatio, "near-limit-ratio", 0.8, "upstream's NEAR_LIMIT_RATIO: an admitted hit that leaves less than (1 - this) of its bucket counts in ratelimit_service_rate_limit_near_limit")
	fs.StringVar(&c.GRPCTLSClientCA, "grpc-tls-client-ca", "", "PEM CA bundle: require and verify client certificates (mTLS)")
	fs.StringVar(&c.GRPCTLSClientSAN, "grpc-tls-client-san", "", "require this subject alternative name in the client certificate (with --grpc-tls-client-ca)")
	c.ConfigType = ConfigFile
	fs.Var(upper{&c.ConfigType}, "config-type", "where the rules come from: FILE (--config-dir) or GRPC_XDS_SOTW (an xDS management server, --xds-*)")
	fs.StringVar(&c.ConfigDir, "config-dir", "/etc/sharelimit/config", "directory of descriptor YAML files (*.yaml, *.yml; dotfiles ignored), watched for changes")
	fs.BoolVar(&c.ConfigAllFiles, "config-all-files", false, "read every file under --config-dir, in subdirectories too, whatever its name (dotfiles skipped), as upstream does; on when the directory comes from RUNTIME_*")
	fs.Var(seconds{&c.ReloadDebounce}, "reload-debounce", "wait this long after the last change in --config-dir before reloading")
	fs.BoolVar(&c.MergeDomainConfig, "merge-domain-config", false, "merge files that define the same domain instead of refusing them")
	fs.BoolVar(&c.ForceStart, "force-start-without-initial-config", false, "serve with no rules when the first config cannot be loaded (a bad first config, or the xDS server unreachable)")
	fs.BoolVar(&c.HealthyWithConfig, "healthy-with-at-least-one-config-loaded", false, "report NOT_SERVING until a config with at least one domain is loaded")
	fs.StringVar(&c.XDSServerURL, "xds-server-url", "localhost:18000", "xDS management server address (with --config-type GRPC_XDS_SOTW)")
	fs.StringVar(&c.XDSNodeID, "xds-node-id", "default", "node ID sent to the xDS server")
	fs.StringVar(&c.XDSNodeMetadata, "xds-node-metadata", "", "node metadata sent to the xDS server: k1:v1,k2=v2")
	fs.StringVar(&c.XDSHeaders, "xds-headers", "", "gRPC metadata sent with every xDS request: k1:v1,k2:v2")
	fs.BoolVar(&c.XDSTLS, "xds-tls", false, "connect to the xDS server over TLS")
	fs.StringVar(&c.XDSTLSCert, "xds-tls-cert", "", "PEM client certificate for the xDS server (with --xds-tls-key)")
	fs.StringVar(&c.XDSTLSKey, "xds-tls-key", "", "PEM private key of --xds-tls-cert")
	fs.StringVar(&c.XDSTLSCA, "xds-tls-ca", "", "PEM CA bundle that verifies the xDS server (default: the system's)")
	fs.StringVar(&c.XDSTLSSAN, "xds-tls-san", "", "name to verify in the xDS server's certificate (default: the host of --xds-server-url)")
	fs.Var(seconds{&c.XDSBackoffInitial}, "xds-backoff-initial", "first wait before reconnecting to the xDS server")
	fs.Var(seconds{&c.XDSBackoffMax}, "xds-backoff-max", "longest wait between reconnections to the xDS server")
	fs.Float64Var(&c.XDSBackoffJitter, "xds-backoff-jitter", 0.5, "random factor, 0 to 1, applied to each xDS reconnection wait")
	fs.IntVar(&c.XDSMaxMsgSize, "xds-max-msg-size", 0, "largest xDS response accepted, in bytes; 0 = gRPC's default")
	fs.IntVar(&c.Replicas, "replicas", 1, "replica count: the static weight is 1/N; with Consul, the count until Consul first answers")
	fs.StringVar(&c.ConsulService, "consul-service", "", "Consul service whose passing instances are the replicas; empty = static membership")
	fs.StringVar(&c.ConsulFilter, "consul-filter", "", "Consul filter expression applied to the health query")
	fs.StringVar(&c.ConsulDatacenter, "consul-datacenter", "", "Consul datacenter to query (default: the agent's)")
	fs.BoolVar(&c.ConsulStale, "consul-stale", true, "allow stale reads, so the count survives a lost Consul leader")
	fs.Float64Var(&c.ConsulQueryRate, "consul-query-rate", 2, "most Consul blocking queries per second")
	fs.Var(seconds{&c.ConsulWait}, "consul-wait", "how long one blocking query may wait for a change")
	fs.Var(domainServices{&c.DomainServices}, "domain-service", "DOMAIN=SERVICE: the Consul service whose replicas share DOMAIN's limits (repeatable; comma-separated in the variable)")
	fs.BoolVar(&c.ConsulWeights, "consul-weights", true, "divide by the instances' Consul weights (Weights.Passing) instead of counting each instance 1")
	fs.BoolVar(&c.ConsulCache, "consul-cache", true, "query through the local agent's cache (?cached), which Consul's streaming backend serves; falls back to plain blocking queries")
	fs.Var(seconds{&c.MembershipHold}, "membership-hold", "how long a membership change that grows this replica's share must hold before it applies (a shrink applies at once); 0 = off")
	fs.Var(seconds{&c.MembershipGrace}, "membership-grace", "how long a Consul instance that does not pass its checks (yet, or any more), or has left the catalog, still counts after it last passed or was first seen, and a --peers-dns address after the last answer that listed it; 0 = count only instances listed passing, or the addresses of the last answer")
	fs.StringVar(&c.ShareMode, "share-mode", ShareCluster, "how limits without share: in their YAML are divided: cluster (by membership) or demand (by each replica's demand; per-value rules for their hottest values)")
	fs.StringVar(&c.DemandPrefix, "demand-prefix", "sharelimit/demand/", "Consul KV prefix for demand reports and the leader's share parameters")
	fs.Var(seconds{&c.DemandInterval}, "demand-interval", "how often, at most, a replica writes its demand to Consul")
	fs.Float64Var(&c.DemandMaxWrites, "demand-max-writes", 100, "most demand writes per second per service, all replicas together: the interval stretches to N/this")
	fs.IntVar(&c.DemandTopKeys, "demand-top-keys", 64, "values of each per-value demand rule shared by demand, hottest first (0-1024; 0: per-value rules keep equal shares); the others keep equal shares")
	fs.StringVar(&c.Node, "node", "", "this node's name in Consul (default: the local agent's node name)")
	fs.StringVar(&c.PeersDNS, "peers-dns", "", "DNS name whose A/AAAA records are the replicas (a Kubernetes headless Service, <service>.service.consul, a compose service): the weight is 1/their count; excludes --consul-service")
	fs.StringVar(&c.PeersDNSServer, "peers-dns-server", "", "DNS server (host:port) asked for --peers-dns over TCP instead of the system resolver, e.g. Consul's DNS, which answers at most 3 records over UDP")
	fs.Var(seconds{&c.PeersDNSInterval}, "peers-dns-interval", "how often --peers-dns is resolved again")
	fs.IntVar(&c.MaxBuckets, "max-buckets", 1_000_000, "most live token buckets, overflow buckets included; past it, new keys share an overflow bucket")
	fs.BoolVar(&c.RLQS, "rlqs", false, "serve Envoy's Rate Limit Quota Service (RLQS) on the gRPC listener: Envoys that open a stream enforce parts of this replica's share themselves; membership grows then wait at least --rlqs-ttl")
	fs.Var(seconds{&c.RLQSTTL}, "rlqs-ttl", "time to live of each RLQS assignment, whole seconds (Envoy reports every 5s, and each answer renews it)")
	fs.Var(seconds{&c.RLQSAbandonAfter}, "rlqs-abandon-after", "an RLQS bucket an Envoy reports idle this long is abandoned (Envoy never drops one itself)")
	fs.Var(seconds{&c.SweepInterval}, "sweep-interval", "how often buckets that have refilled are dropped")
	fs.BoolVar(&c.ShadowMode, "shadow-mode", false, "global shadow mode: always answer OK overall, still count what would be over limit")
	fs.BoolVar(&c.QuotaMode, "quota-mode", false, "global quota mode: every descriptor is in quota mode (OVER_LIMIT overall only when all are over)")
	fs.BoolVar(&c.ResponseDynamicMetadata, "response-dynamic-metadata", false, "return upstream's dynamic metadata (domain, descriptors, hits_addend, descriptor metadata)")
	fs.BoolVar(&c.ResponseHeaders, "response-headers", false, "add RateLimit-Limit/-Remaining/-Reset response headers")
	fs.StringVar(&c.HeaderLimit, "header-limit", "RateLimit-Limit", "name of the limit response header")
	fs.StringVar(&c.HeaderRemaining, "header-remaining", "RateLimit-Remaining", "name of the remaining response header")
	fs.StringVar(&c.HeaderReset, "header-reset", "RateLimit-Reset", "name of the reset response header")
	fs.Var(seconds{&c.Drain}, "drain", "on SIGTERM, report NOT_SERVING for this long before stopping")
	fs.Var(seconds{&c.ShutdownTimeout}, "shutdown-timeout", "after draining, how long in-flight requests get to finish")
	fs.StringVar(&c.StateFile, "state-file", "", "save every live bucket, the key seed and the membership views here on shutdown (and every --state-interval), and restore them on start; empty: off")
	fs.Var(seconds{&c.StateMaxAge}, "state-max-age", "a state file older than this is not restored")
	fs.Var(seconds{&c.StateInterval}, "state-interval", "also save the state this often while running, so a crash loses at most this much; 0: only on shutdown")
	fs.Var(joinRamp{&c.JoinRamp}, "join-ramp", "a replica that starts with nothing restored while other replicas serve fills new buckets from empty to full over this long: auto (each rule's burst time B/R, at most 10s), a duration, or 0 (off)")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	return fs
}

// Defaults returns the settings with every default applied.
func Defaults() *Config {
	c := &Config{
		ReloadDebounce:   250 * time.Millisecond,
		ConsulWait:       time.Minute,
		MembershipHold:   2 * time.Second,
		MembershipGrace:  30 * time.Second,
		DemandInterval:   time.Second,
		SweepInterval:    10 * time.Second,
		RLQSTTL:          15 * time.Second,
		RLQSAbandonAfter: 2 * time.Minute,
		Drain:            5 * time.Second,
		ShutdownTimeout:  10 * time.Second,
		StateMaxAge:      10 * time.Minute,
		JoinRamp:         JoinRampAuto,
		// upstream's XDS_CLIENT_BACKOFF_* defaults
		XDSBackoffInitial: 10 * time.Second,
		XDSBackoffMax:     time.Minute,
		// membership.DefaultDNSInterval
		PeersDNSInterval: 5 * time.Second,
	}
	c.FlagSet("defaults") // binds and applies the flag defaults
	return c
}
