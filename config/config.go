package config

import (
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

	// RLQS serves Envoy's Rate Limit Quota Service on the gRPC listener.
	// It acts only for a client that opens a stream, and hands out parts of
	// the same share RLS enforces, so it is on by default.
	RLQS bool
	// RLQSTTL is every RLQS assignment's time to live (whole seconds, at
	// least MinRLQSTTL).
	RLQSTTL time.Duration
	// RLQSAbandonAfter: a bucket an Envoy reports idle this long is
	// abandoned (Envoy never drops a bucket itself).
	RLQSAbandonAfter time.Duration

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

// MinRLQSTTL is the shortest --rlqs-ttl: Envoy reports every 5 s whatever it
// is told, and only the answer to a report renews an assignment, so a TTL
// of 5 s or less lets assignments expire between answers (Envoy then falls
// back, and builds each renewed limiter new, full). Two report intervals
// leave one answer's worth of slack.
const MinRLQSTTL = 10 * time.Second
