// Package config holds the daemon's settings. They are read once, at start-up,
// from flags, SHARELIMIT_* environment variables and, for a container that
// still carries envoyproxy/ratelimit's environment, upstream's own variables
// (a flag wins over its SHARELIMIT_* variable, which wins over upstream's
// name), and checked by Validate before anything starts. Nothing re-reads the
// environment later: a running daemon's settings are exactly what it logged at
// start. ApplyEnv, the rule that maps flags to variables, is shared with the
// other subcommands that read their flags from the environment (sharelimit
// bench).
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Config is the daemon's settings. The zero value is not valid; use Parse.
type Config struct {
	GRPCAddr    string
	HTTPAddr    string
	AllowRemote bool

	// LocalHTTPAddr is a loopback listener serving every admin page, for an
	// admin listener (HTTPAddr) beyond loopback, which serves other hosts
	// only /healthcheck and /json, as upstream's admin port. Parse sets it
	// to DefaultLocalHTTPAddr when HTTPAddr is beyond loopback and nothing
	// names it; "" is none.
	LocalHTTPAddr string

	// DebugAddr is a second admin listener, as upstream's DEBUG_HOST:DEBUG_PORT;
	// empty means none.
	DebugAddr string

	// MetricsAddr is a listener that serves only metrics, at MetricsPath:
	// upstream's ratelimit_service_* series (upstream's USE_PROMETHEUS,
	// PROMETHEUS_ADDR and PROMETHEUS_PATH) and every sharelimit_* series.
	// Empty means none. It may be beyond loopback without AllowRemote.
	MetricsAddr string
	MetricsPath string
	// MetricsMilliseconds reports upstream's response time in milliseconds
	// (PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS).
	MetricsMilliseconds bool
	// NearLimitRatio is upstream's NEAR_LIMIT_RATIO: an admitted hit that
	// leaves less than (1 - ratio) of its bucket counts as near_limit.
	NearLimitRatio float64

	// GRPCTransport serves the gRPC listener: TransportDirect or
	// TransportGRPCGo.
	GRPCTransport string

	GRPCTLSCert      string
	GRPCTLSKey       string
	GRPCTLSClientCA  string
	GRPCTLSClientSAN string

	// ConfigType is where the rules come from: ConfigFile or ConfigXDS.
	ConfigType     string
	ConfigDir      string
	ConfigAllFiles bool
	ReloadDebounce time.Duration
	// MergeDomainConfig merges files that define the same domain, as
	// upstream's MERGE_DOMAIN_CONFIG, instead of refusing them.
	MergeDomainConfig bool
	// ForceStart serves with no rules when the first config cannot be loaded
	// (a bad first config, or an unreachable xDS server), instead of exiting.
	ForceStart bool
	// HealthyWithConfig keeps health NOT_SERVING until a config with at least
	// one domain is loaded.
	HealthyWithConfig bool

	// The xDS client (ConfigType ConfigXDS). XDSNodeMetadata and XDSHeaders
	// are upstream's "k1:v1,k2=v2" lists; read them with ParseKeyValues.
	XDSServerURL      string
	XDSNodeID         string
	XDSNodeMetadata   string
	XDSHeaders        string
	XDSTLS            bool
	XDSTLSCert        string
	XDSTLSKey         string
	XDSTLSCA          string
	XDSTLSSAN         string
	XDSBackoffInitial time.Duration
	XDSBackoffMax     time.Duration
	// XDSBackoffJitter is the random factor, from 0 (none) to 1, applied to
	// each back-off delay.
	XDSBackoffJitter float64
	// XDSMaxMsgSize is the largest xDS response accepted, in bytes; 0 means
	// gRPC's default.
	XDSMaxMsgSize int

	Replicas         int
	ConsulService    string
	ConsulFilter     string
	ConsulDatacenter string
	ConsulStale      bool
	ConsulQueryRate  float64
	ConsulWait       time.Duration
	Node             string
	// DomainServices maps domains to the Consul service whose replicas share
	// their limits; other domains use ConsulService (or static membership).
	DomainServices []DomainService
	// ConsulWeights makes the share weight-proportional to the instances'
	// Weights.Passing; off, every instance counts 1.
	ConsulWeights bool
	// ConsulCache queries through the local agent's cache (streaming).
	ConsulCache bool
	// MembershipHold is how long a view change that grows this replica's
	// share must hold before it applies; 0 applies every change at once.
	MembershipHold time.Duration
	// MembershipGrace is how long an instance that is not listed passing
	// (failing its checks, not yet passing, or gone from the catalog)
	// still counts after it was last seen passing or first seen, and a
	// --peers-dns address after the last answer that listed it; 0 counts
	// only the instances listed passing, or the last answer's addresses.
	MembershipGrace time.Duration
	// PeersDNS is the DNS name whose A and AAAA records are the replicas,
	// "" for none; it excludes ConsulService and DomainServices.
	// PeersDNSServer, host:port, is asked over TCP instead of the system
	// resolver; PeersDNSInterval is how often the name is resolved again.
	PeersDNS         string
	PeersDNSServer   string
	PeersDNSInterval time.Duration

	// ShareMode is "cluster" (limits divided by membership) or "demand"
	// (every cluster-shared limit divided by demand, a per-value rule's
	// for its hottest values); see ShareCluster and ShareDemand.
	ShareMode string
	// DemandPrefix is the Consul KV prefix under which replicas publish
	// their demand and the leader its parameters.
	DemandPrefix string
	// DemandInterval is how often, at most, a replica writes its demand.
	DemandInterval time.Duration
	// DemandMaxWrites bounds a service's demand writes per second, all
	// replicas together: the interval stretches to n/DemandMaxWrites.
	DemandMaxWrites float64
	// DemandTopKeys is how many values of each per-value demand rule are
	// shared by demand (its hottest); the rest keep equal shares.
	DemandTopKeys int

	MaxBuckets    int
	SweepInterval time.Duration

	ShadowMode              bool
	QuotaMode               bool
	ResponseDynamicMetadata bool
	ResponseHeaders         bool
	HeaderLimit             string
	HeaderRemaining         string
	HeaderReset             string

	Drain           time.Duration
	ShutdownTimeout time.Duration

	// StateFile is where the buckets, the key seed and the membership views
	// are saved on shutdown (and every StateInterval) and restored from on
	// start; "" for none.
	StateFile string
	// StateMaxAge: a state file older than this is not restored.
	StateMaxAge time.Duration
	// StateInterval is how often the state is checkpointed while running;
	// 0 only on shutdown.
	StateInterval time.Duration
	// JoinRamp: a replica that starts with nothing restored while others
	// serve fills its new buckets from empty to full over this long.
	// JoinRampAuto (the default) is each rule's burst time, B ÷ R, at most
	// 10 s; 0 is off.
	JoinRamp time.Duration

	LogFormat string
	LogLevel  string

	// UpstreamBy lists what put the daemon in upstream's mode, empty for none: the
	// binary run as upstream's command (/bin/ratelimit), and the variables
	// set that only upstream reads (RUNTIME_ROOT, CONFIG_TYPE, REDIS_*, ...;
	// not HOST, PORT, LOG_LEVEL or LOG_FORMAT). In that mode the listeners
	// default to upstream's addresses, 0.0.0.0:8081, :8080 and :6070, and a
	// static --replicas 1 is a fault: each replica enforces every limit whole,
	// where upstream's replicas shared one count in Redis.
	UpstreamBy []string

	// Notices are what Parse found worth telling the operator at start-up,
	// about upstream's variables: which it applied, which it ignored and why.
	// They name variables, never their values. The caller logs them once the
	// logger exists.
	Notices []Notice
}

// The values of GRPCTransport.
const (
	// TransportDirect answers ShouldRateLimit on the daemon's own HTTP/2
	// transport and relays every other call to grpc-go (package server/h2).
	TransportDirect = "direct"
	// TransportGRPCGo serves every call with grpc-go.
	TransportGRPCGo = "grpc-go"
)

// The values of ShareMode.
const (
	ShareCluster = "cluster"
	ShareDemand  = "demand"
)

// The values of ConfigType.
const (
	ConfigFile = "FILE"          // rules from the files in ConfigDir
	ConfigXDS  = "GRPC_XDS_SOTW" // rules from an xDS management server (state of the world)
)

// DefaultLocalHTTPAddr is --local-http-addr when --http-addr is beyond
// loopback and nothing names it: beside upstream's 8080 and 8081.
const DefaultLocalHTTPAddr = "127.0.0.1:8082"

// EnvPrefix starts every variable that mirrors a flag.
const EnvPrefix = "SHARELIMIT_"

// EnvName is the environment variable for a flag: --grpc-addr is
// SHARELIMIT_GRPC_ADDR.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

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
		ReloadDebounce:  250 * time.Millisecond,
		ConsulWait:      time.Minute,
		MembershipHold:  2 * time.Second,
		MembershipGrace: 30 * time.Second,
		DemandInterval:  time.Second,
		SweepInterval:   10 * time.Second,
		Drain:           5 * time.Second,
		ShutdownTimeout: 10 * time.Second,
		StateMaxAge:     10 * time.Minute,
		JoinRamp:        JoinRampAuto,
		// upstream's XDS_CLIENT_BACKOFF_* defaults
		XDSBackoffInitial: 10 * time.Second,
		XDSBackoffMax:     time.Minute,
		// membership.DefaultDNSInterval
		PeersDNSInterval: 5 * time.Second,
	}
	c.FlagSet("defaults") // binds and applies the flag defaults
	return c
}

// Parse reads flags from args; for every flag not given, its SHARELIMIT_*
// variable from getenv; then, for every setting still not given, upstream's
// variable for it (UpstreamVariables), so the precedence is flag >
// SHARELIMIT_* > upstream's name > default. What it did with upstream's
// variables is in the result's Notices. Usage goes to out. It does not
// validate; call Validate.
//
// getenv cannot list names, so Parse sees every variable upstream's settings
// name but not the families only a prefix identifies (OTEL_*); ParseEnviron
// sees those too.
func Parse(name string, args []string, getenv func(string) string, out io.Writer) (*Config, error) {
	return parse(name, args, getenv, nil, false, out)
}

// ParseEnviron is Parse with the environment given as os.Environ gives it,
// "NAME=value" entries (the first of a repeated name counts, as for
// os.Getenv). Knowing every name set, it also names in Notices the variables
// of upstream's families that getenv cannot list (UpstreamVariables' names
// ending in "*").
func ParseEnviron(name string, args, environ []string, out io.Writer) (*Config, error) {
	return parseEnviron(name, args, environ, false, out)
}

// ParseUpstreamCommand is ParseEnviron for the binary run as upstream's
// command, /bin/ratelimit: upstream's mode whatever the environment holds
// (see Config.UpstreamBy).
func ParseUpstreamCommand(name string, args, environ []string, out io.Writer) (*Config, error) {
	return parseEnviron(name, args, environ, true, out)
}

func parseEnviron(name string, args, environ []string, asCommand bool, out io.Writer) (*Config, error) {
	getenv, names := readEnviron(environ)
	return parse(name, args, getenv, names, asCommand, out)
}

// Getenv reads an environment given as os.Environ gives it, "NAME=value"
// entries, as os.Getenv reads the process's: the first of a repeated name
// counts.
func Getenv(environ []string) func(string) string {
	getenv, _ := readEnviron(environ)
	return getenv
}

// readEnviron is Getenv, and also every name set, in order.
func readEnviron(environ []string) (getenv func(string) string, names []string) {
	vars := make(map[string]string, len(environ))
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		if _, seen := vars[k]; !seen {
			vars[k] = v
			names = append(names, k)
		}
	}
	return func(k string) string { return vars[k] }, names
}

// parse is Parse; names, when not nil, are all the variables set; asCommand
// says the binary runs as upstream's command.
func parse(name string, args []string, getenv func(string) string, names []string, asCommand bool, out io.Writer) (*Config, error) {
	c := Defaults()
	fs := c.FlagSet(name)
	fs.SetOutput(out)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := ApplyEnv(fs, getenv); err != nil {
		return nil, err
	}
	notices, err := applyUpstream(fs, c, getenv, names, asCommand)
	if err != nil {
		return nil, err
	}
	c.LogFormat = strings.ToLower(c.LogFormat) // text or json in any case, as LOG_FORMAT
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if host, _, err := net.SplitHostPort(c.HTTPAddr); err == nil && !IsLoopback(host) && !given["local-http-addr"] && !strings.HasPrefix(c.HTTPAddr, "unix:") {
		c.LocalHTTPAddr = DefaultLocalHTTPAddr
	}

	if n, ok := upstreamDefaultDir(c, given["config-dir"], isDir); ok {
		notices = append(notices, n)
	}
	c.Notices = notices
	return c, nil
}

// upstreamDefaultDir: a container that relied on upstream's default config
// directory, and sets nothing, finds its files there. Only when no setting
// named a directory, sharelimit's default does not exist and upstream's does.
func upstreamDefaultDir(c *Config, given bool, isDir func(string) bool) (Notice, bool) {
	up := filepath.Join(upstreamRuntimeRoot, upstreamAppDir)
	if given || c.ConfigType != ConfigFile || c.ConfigDir != Defaults().ConfigDir || isDir(c.ConfigDir) || !isDir(up) {
		return Notice{}, false
	}
	c.ConfigDir, c.ConfigAllFiles = up, true
	return Notice{Level: slog.LevelInfo, Message: "config directory: upstream's default " + up + ", read as upstream reads it (no --config-dir given, and " + Defaults().ConfigDir + " does not exist)"}, true
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// ApplyEnv sets every flag of fs that was not given on the command line from its
// variable (EnvName), read with getenv; call it after fs.Parse. A flag wins over
// its variable, and an empty variable counts as unset, so the flag keeps its
// default. It reports every bad value at once, each naming its variable. Every
// subcommand that mirrors its flags in the environment uses it, so they all
// follow the one rule the README documents.
func ApplyEnv(fs *flag.FlagSet, getenv func(string) string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		env := EnvName(f.Name)
		if v := getenv(env); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", env, err))
			}
		}
	})
	return errors.Join(errs...)
}
