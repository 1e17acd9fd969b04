package config

import (
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"
)

// A container moving from envoyproxy/ratelimit keeps upstream's environment.
// This file reads it: one table (upstreamTable) says what every variable of
// upstream's settings becomes here, or why it is ignored; Parse applies it
// after flags and SHARELIMIT_* variables, and UpstreamVariables hands the same
// table to the documentation.

// Notice is something Parse found worth telling the operator at start-up. It
// names variables, never their values, which may be secrets (REDIS_AUTH).
type Notice struct {
	Level   slog.Level // slog.LevelInfo or slog.LevelWarn
	Message string     // names the variables, grouped as they are in Vars
	Vars    []string   // the variables it is about, in the order the message names them
}

// UpstreamVar is one of upstream's environment variables and what sharelimit
// does with it.
type UpstreamVar struct {
	// Name is the variable, or a family of them: a prefix followed by "*"
	// (OTEL_*), for the names that no list can hold.
	Name string
	// To is the flag it sets ("--grpc-addr"; several are comma-separated), or
	// UpstreamIgnored.
	To string
	// Why says how it maps, or why it is ignored.
	Why string
}

// UpstreamIgnored is the To of a variable that sets nothing here.
const UpstreamIgnored = "ignored"

// UpstreamVariables returns every upstream variable sharelimit knows, in the
// order of the documentation: those it maps, then those it ignores. Parse
// reads exactly these.
func UpstreamVariables() []UpstreamVar {
	out := make([]UpstreamVar, len(upstreamTable))
	for i, v := range upstreamTable {
		out[i] = v.UpstreamVar
	}
	return out
}

// Upstream's defaults that sharelimit takes over when only part of a setting
// is given.
const (
	upstreamRuntimeRoot = "/srv/runtime_data/current"
	upstreamAppDir      = "config"
	upstreamDebugPort   = "6070"
	upstreamHost        = "0.0.0.0"
	// upstreamCommand is how upstream's images run it, and what its
	// manifests name as the command.
	upstreamCommand = "/bin/ratelimit"
)

// genericVar marks upstream's variables that other programs set too: alone,
// they do not say a container was upstream's.
var genericVar = map[string]bool{"HOST": true, "PORT": true, "LOG_LEVEL": true, "LOG_FORMAT": true}

// upstreamVar is a table row with what Parse needs.
type upstreamVar struct {
	UpstreamVar
	// flag is the setting it feeds: a flag or its SHARELIMIT_* variable given
	// for it wins. Empty for an ignored variable.
	flag string
	// conv turns its value into the flag's. Nil when code below combines it
	// with other variables (a host and a port make one address).
	conv func(string) (string, error)
	// gate is the switch that must be on for it to apply, as upstream.
	gate gate
	// harmless marks an ignored variable asking for what sharelimit always
	// does: it is reported at info level, not in the warning.
	harmless bool
	// group is the reason an ignored variable is reported under.
	group string
}

// gate is a switch that decides whether other variables apply.
type gate int

const (
	always      gate = iota
	gateXDS          // CONFIG_TYPE=GRPC_XDS_SOTW, from any source
	gateGRPCTLS      // GRPC_SERVER_USE_TLS=true
	gateXDSTLS       // xDS, and CONFIG_GRPC_XDS_SERVER_USE_TLS=true or --xds-tls
	gateProm         // USE_PROMETHEUS=true
)

// The reasons ignored variables are grouped under in the warning. They are
// the Why of the rows that are always ignored; the conditional ones are about
// a switch that is off.
const (
	whyBackend   = "counters are token buckets in memory, no Redis or Memcache"
	whyStats     = "metrics are Prometheus at /metrics on the admin listener, no statsd or DogStatsD"
	whyMapper    = "upstream's default mapping is built in (ratelimit_service_*); there are no statsd stats for another mapping to rename"
	whyPromOff   = "used only with USE_PROMETHEUS=true, as upstream"
	whyTracing   = "sharelimit exports no traces"
	whyOverLimit = "a request over its limit never takes tokens here, as if this were true"
	whyConnAge   = "Envoy connects over loopback on the same node, so there are no connections to rebalance"
	whyRetry     = "reconnections to the xDS server follow XDS_CLIENT_BACKOFF_* alone"
	whyUDS       = "GRPC_UDS takes precedence, as upstream"
	whyTLSOff    = "used only with GRPC_SERVER_USE_TLS=true, as upstream"
	whyXDSOff    = "used only with CONFIG_TYPE=GRPC_XDS_SOTW, as upstream"
	whyXDSTLSOff = "used only with CONFIG_GRPC_XDS_SERVER_USE_TLS=true, as upstream"
	whyNoDir     = "the rules come from xDS (CONFIG_TYPE=GRPC_XDS_SOTW), not from a directory"

	// whyAccepted starts the Why of a harmless variable.
	whyAccepted = "accepted with nothing to do: "
)

// warnOrder is the order of the groups in the warning.
var warnOrder = []string{whyXDSOff, whyTLSOff, whyXDSTLSOff, whyPromOff, whyNoDir, whyUDS, whyBackend, whyOverLimit, whyStats, whyMapper, whyTracing, whyConnAge, whyRetry}

// Converters from upstream's values (envconfig's rules) to the flags'.
var (
	convText = func(v string) (string, error) { return v, nil }
	convBool = func(v string) (string, error) {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return "", fmt.Errorf("want true or false, got %q", v)
		}
		return strconv.FormatBool(b), nil
	}
	convDuration = func(v string) (string, error) {
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return "", fmt.Errorf("want a duration such as 10s, got %q", v)
		}
		return d.String(), nil
	}
	convHeader = func(v string) (string, error) {
		if !validHeader(v) {
			return "", fmt.Errorf("%q is not a valid header name", v)
		}
		return v, nil
	}
	convKeyValues = func(v string) (string, error) {
		if _, err := ParseKeyValues(v); err != nil {
			return "", err
		}
		return v, nil
	}
	convConfigType = func(v string) (string, error) {
		if t := strings.ToUpper(v); t == ConfigFile || t == ConfigXDS {
			return t, nil
		}
		return "", fmt.Errorf("want FILE or GRPC_XDS_SOTW, got %q", v)
	}
	convLogLevel = func(v string) (string, error) {
		// logrus's names, as upstream parses them; slog has no trace, fatal
		// or panic, so each becomes the nearest level.
		switch strings.ToLower(v) {
		case "trace", "debug":
			return "debug", nil
		case "info":
			return "info", nil
		case "warn", "warning":
			return "warn", nil
		case "error", "fatal", "panic":
			return "error", nil
		}
		return "", fmt.Errorf("want trace, debug, info, warn, error, fatal or panic, got %q", v)
	}
	convLogFormat = func(v string) (string, error) {
		// Upstream logs JSON for "json" in any case and text for any other
		// value, and refuses none.
		if strings.EqualFold(strings.TrimSpace(v), "json") {
			return "json", nil
		}
		return "text", nil
	}
	convRandomFactor = func(v string) (string, error) {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || !(f >= 0 && f <= 1) {
			return "", fmt.Errorf("want a random factor between 0 and 1, got %q", v)
		}
		return strconv.FormatFloat(f, 'g', -1, 64), nil
	}
	convMsgSize = func(v string) (string, error) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > math.MaxInt32 {
			return "", fmt.Errorf("want a size in bytes, 0 to %d, got %q", math.MaxInt32, v)
		}
		return strconv.FormatInt(n, 10), nil
	}
)

// upstreamTable is the single source of truth: Parse reads these names and
// nothing else, and the documentation is generated from them.
var upstreamTable = buildUpstreamTable()

func buildUpstreamTable() []upstreamVar {
	mapped := func(name, flag, why string, conv func(string) (string, error)) upstreamVar {
		return upstreamVar{UpstreamVar: UpstreamVar{Name: name, To: "--" + flag, Why: why}, flag: flag, conv: conv}
	}
	gated := func(g gate, v upstreamVar) upstreamVar { v.gate = g; return v }
	ignored := func(why string, names ...string) []upstreamVar {
		var out []upstreamVar
		for _, n := range names {
			out = append(out, upstreamVar{UpstreamVar: UpstreamVar{Name: n, To: UpstreamIgnored, Why: why}, group: why})
		}
		return out
	}
	harmless := func(name, why string) upstreamVar {
		return upstreamVar{UpstreamVar: UpstreamVar{Name: name, To: UpstreamIgnored, Why: whyAccepted + why}, harmless: true}
	}
	t := []upstreamVar{
		// Listeners. A host alone keeps the default port, a port alone the
		// loopback host; an explicit non-loopback host is honoured.
		// Listeners. In upstream's mode (a variable only upstream reads is
		// set, or the binary runs as /bin/ratelimit) the three listen where
		// upstream's did, 0.0.0.0:8081, :8080 and :6070, and these change a
		// part; otherwise they change a part of the loopback defaults.
		mapped("GRPC_HOST", "grpc-addr", "the host of --grpc-addr (0.0.0.0 in upstream's mode, else 127.0.0.1; the port stays 8081 unless GRPC_PORT is set); a host that is not loopback also sets --allow-remote", nil),
		mapped("GRPC_PORT", "grpc-addr", "the port of --grpc-addr (the host is 0.0.0.0 in upstream's mode, else 127.0.0.1, unless GRPC_HOST is set)", nil),
		mapped("GRPC_UDS", "grpc-addr", "--grpc-addr unix:PATH; it takes precedence over GRPC_HOST and GRPC_PORT, as upstream", nil),
		mapped("HOST", "http-addr", "the host of --http-addr (0.0.0.0 in upstream's mode, else 127.0.0.1; the port stays 8080 unless PORT is set); a host that is not loopback also sets --allow-remote", nil),
		mapped("PORT", "http-addr", "the port of --http-addr (the host is 0.0.0.0 in upstream's mode, else 127.0.0.1, unless HOST is set)", nil),
		mapped("DEBUG_HOST", "debug-addr", "the host of --debug-addr, upstream's debug listener: /rlconfig in upstream's text and /debug/pprof/ (0.0.0.0 in upstream's mode, else 127.0.0.1; the port is 6070 unless DEBUG_PORT is set); a host that is not loopback also sets --allow-remote", nil),
		mapped("DEBUG_PORT", "debug-addr", "the port of --debug-addr (the host is 0.0.0.0 in upstream's mode, else 127.0.0.1, unless DEBUG_HOST is set); in upstream's mode the debug listener is always on, at 6070 by default; otherwise there is none without DEBUG_HOST or DEBUG_PORT", nil),

		// gRPC TLS: upstream reads the files only with GRPC_SERVER_USE_TLS=true.
		{UpstreamVar: UpstreamVar{Name: "GRPC_SERVER_USE_TLS", To: "--grpc-tls-cert, --grpc-tls-key, --grpc-tls-client-ca, --grpc-tls-client-san",
			Why: "true applies GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY, GRPC_CLIENT_TLS_CACERT and GRPC_CLIENT_TLS_SAN, and needs the certificate and key; otherwise they do nothing, as upstream"}},
		gated(gateGRPCTLS, mapped("GRPC_SERVER_TLS_CERT", "grpc-tls-cert", "with GRPC_SERVER_USE_TLS=true", convText)),
		gated(gateGRPCTLS, mapped("GRPC_SERVER_TLS_KEY", "grpc-tls-key", "with GRPC_SERVER_USE_TLS=true", convText)),
		gated(gateGRPCTLS, mapped("GRPC_CLIENT_TLS_CACERT", "grpc-tls-client-ca", "with GRPC_SERVER_USE_TLS=true: client certificates are required and verified", convText)),
		gated(gateGRPCTLS, mapped("GRPC_CLIENT_TLS_SAN", "grpc-tls-client-san", "with GRPC_SERVER_USE_TLS=true and GRPC_CLIENT_TLS_CACERT: the client certificate must name it", convText)),

		mapped("LOG_LEVEL", "log-level", "logrus's names, any case: trace and debug are debug, warning is warn, fatal and panic are error; unset, the level stays info (upstream's default is warn)", convLogLevel),
		mapped("LOG_FORMAT", "log-format", "json in any case is json; any other value is text, as upstream", convLogFormat),

		// Where the rules come from. CONFIG_TYPE comes first: it decides
		// which of the rows after it apply.
		mapped("CONFIG_TYPE", "config-type", "FILE or GRPC_XDS_SOTW, any case", convConfigType),
		mapped("RUNTIME_ROOT", "config-dir", "--config-dir is RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/RUNTIME_APPDIRECTORY when any of the three is set (upstream's defaults: /srv/runtime_data/current, empty, config); every file under it is read, in subdirectories too, whatever its name, as upstream reads it (--config-all-files)", nil),
		mapped("RUNTIME_SUBDIRECTORY", "config-dir", "see RUNTIME_ROOT", nil),
		mapped("RUNTIME_APPDIRECTORY", "config-dir", "see RUNTIME_ROOT", nil),
		harmless("RUNTIME_WATCH_ROOT", "sharelimit watches the config directory itself, so edits and symlink swaps inside it reload at once, and a swap of a parent directory, such as RUNTIME_ROOT, is found by the periodic re-read"),
		harmless("RUNTIME_IGNOREDOTFILES", "dotfiles are always ignored"),
		mapped("MERGE_DOMAIN_CONFIG", "merge-domain-config", "true or false", convBool),
		mapped("FORCE_START_WITHOUT_INITIAL_CONFIG", "force-start-without-initial-config", "true or false", convBool),
		mapped("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "healthy-with-at-least-one-config-loaded", "true or false", convBool),

		mapped("SHADOW_MODE", "shadow-mode", "true or false", convBool),
		mapped("QUOTA_MODE", "quota-mode", "true or false", convBool),
		mapped("RESPONSE_DYNAMIC_METADATA", "response-dynamic-metadata", "true or false", convBool),
		mapped("LIMIT_RESPONSE_HEADERS_ENABLED", "response-headers", "true or false", convBool),
		mapped("LIMIT_LIMIT_HEADER", "header-limit", "a header name", convHeader),
		mapped("LIMIT_REMAINING_HEADER", "header-remaining", "a header name", convHeader),
		mapped("LIMIT_RESET_HEADER", "header-reset", "a header name", convHeader),

		// xDS: upstream reads these only with CONFIG_TYPE=GRPC_XDS_SOTW.
		gated(gateXDS, mapped("CONFIG_GRPC_XDS_SERVER_URL", "xds-server-url", "with CONFIG_TYPE=GRPC_XDS_SOTW", convText)),
		gated(gateXDS, mapped("CONFIG_GRPC_XDS_NODE_ID", "xds-node-id", "with CONFIG_TYPE=GRPC_XDS_SOTW", convText)),
		gated(gateXDS, mapped("CONFIG_GRPC_XDS_NODE_METADATA", "xds-node-metadata", "with CONFIG_TYPE=GRPC_XDS_SOTW; k1:v1,k2=v2", convKeyValues)),
		gated(gateXDS, mapped("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "xds-headers", "with CONFIG_TYPE=GRPC_XDS_SOTW; k1:v1,k2:v2", convKeyValues)),
		gated(gateXDS, mapped("CONFIG_GRPC_XDS_SERVER_USE_TLS", "xds-tls", "with CONFIG_TYPE=GRPC_XDS_SOTW; true also applies the four CONFIG_GRPC_XDS_*_TLS_* variables, which otherwise do nothing, as upstream", convBool)),
		gated(gateXDSTLS, mapped("CONFIG_GRPC_XDS_CLIENT_TLS_CERT", "xds-tls-cert", "with CONFIG_GRPC_XDS_SERVER_USE_TLS=true", convText)),
		gated(gateXDSTLS, mapped("CONFIG_GRPC_XDS_CLIENT_TLS_KEY", "xds-tls-key", "with CONFIG_GRPC_XDS_SERVER_USE_TLS=true", convText)),
		gated(gateXDSTLS, mapped("CONFIG_GRPC_XDS_SERVER_TLS_CACERT", "xds-tls-ca", "with CONFIG_GRPC_XDS_SERVER_USE_TLS=true", convText)),
		gated(gateXDSTLS, mapped("CONFIG_GRPC_XDS_SERVER_TLS_SAN", "xds-tls-san", "with CONFIG_GRPC_XDS_SERVER_USE_TLS=true", convText)),
		gated(gateXDS, mapped("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "xds-backoff-initial", "with CONFIG_TYPE=GRPC_XDS_SOTW; a duration", convDuration)),
		gated(gateXDS, mapped("XDS_CLIENT_BACKOFF_MAX_INTERVAL", "xds-backoff-max", "with CONFIG_TYPE=GRPC_XDS_SOTW; a duration", convDuration)),
		gated(gateXDS, mapped("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "xds-backoff-jitter", "with CONFIG_TYPE=GRPC_XDS_SOTW; between 0 and 1", convRandomFactor)),
		gated(gateXDS, mapped("XDS_CLIENT_BACKOFF_JITTER", "xds-backoff-jitter", "with CONFIG_TYPE=GRPC_XDS_SOTW; false sets it to 0, whatever XDS_CLIENT_BACKOFF_RANDOM_FACTOR says", nil)),
		gated(gateXDS, mapped("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "xds-max-msg-size", "with CONFIG_TYPE=GRPC_XDS_SOTW; bytes", convMsgSize)),

		// Upstream's Prometheus sink: USE_PROMETHEUS=true opens the rows
		// behind it.
		{UpstreamVar: UpstreamVar{Name: "USE_PROMETHEUS", To: "--metrics-addr, --metrics-path",
			Why: "true serves upstream's ratelimit_service_* series, and every sharelimit_* series, on PROMETHEUS_ADDR at PROMETHEUS_PATH (upstream's defaults: :9090, every interface, logged at WARN, and /metrics); otherwise PROMETHEUS_ADDR, PROMETHEUS_PATH and PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS do nothing, as upstream"}},
		gated(gateProm, mapped("PROMETHEUS_ADDR", "metrics-addr", "with USE_PROMETHEUS=true; host:port, or :port for every interface (it needs no --allow-remote: it serves only metrics)", convListenAddr)),
		gated(gateProm, mapped("PROMETHEUS_PATH", "metrics-path", "with USE_PROMETHEUS=true; a path starting with /", convPath)),
		gated(gateProm, mapped("PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS", "metrics-response-time-ms", "with USE_PROMETHEUS=true; true or false", convBool)),
		mapped("NEAR_LIMIT_RATIO", "near-limit-ratio", "between 0 and 1: an admitted hit that leaves less than (1 - ratio) of its bucket's burst, cluster-wide, counts in ratelimit_service_rate_limit_near_limit", convRatio),
	}
	t = append(t, ignored(whyRetry, "CONFIG_GRPC_XDS_SERVER_CONNECT_RETRY_INTERVAL")...)
	t = append(t, ignored(whyConnAge, "GRPC_MAX_CONNECTION_AGE", "GRPC_MAX_CONNECTION_AGE_GRACE")...)
	t = append(t, ignored(whyBackend,
		"BACKEND_TYPE", "CACHE_KEY_PREFIX", "EXPIRATION_JITTER_MAX_SECONDS", "LOCAL_CACHE_SIZE_IN_BYTES",
		"REDIS_SOCKET_TYPE", "REDIS_TYPE", "REDIS_URL", "REDIS_POOL_SIZE", "REDIS_AUTH", "REDIS_TLS",
		"REDIS_TLS_CLIENT_CERT", "REDIS_TLS_CLIENT_KEY", "REDIS_TLS_CACERT", "REDIS_TLS_SKIP_HOSTNAME_VERIFICATION",
		"REDIS_PIPELINE_WINDOW", "REDIS_PIPELINE_LIMIT", "REDIS_CLUSTER_PIPELINE_PARALLELISM",
		"REDIS_PERSECOND", "REDIS_PERSECOND_SOCKET_TYPE", "REDIS_PERSECOND_TYPE", "REDIS_PERSECOND_URL",
		"REDIS_PERSECOND_POOL_SIZE", "REDIS_PERSECOND_AUTH", "REDIS_PERSECOND_TLS", "REDIS_SENTINEL_AUTH",
		"REDIS_PERSECOND_SENTINEL_AUTH", "REDIS_PERSECOND_PIPELINE_WINDOW", "REDIS_PERSECOND_PIPELINE_LIMIT",
		"REDIS_PERSECOND_CLUSTER_PIPELINE_PARALLELISM", "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION",
		"REDIS_TIMEOUT", "REDIS_PERSECOND_TIMEOUT", "REDIS_POOL_ON_EMPTY_BEHAVIOR", "REDIS_PERSECOND_POOL_ON_EMPTY_BEHAVIOR",
		"REDIS_STARTUP_INITIAL_INTERVAL", "REDIS_STARTUP_MAX_INTERVAL", "REDIS_STARTUP_MAX_ELAPSED_TIME",
		"MEMCACHE_HOST_PORT", "MEMCACHE_MAX_IDLE_CONNS", "MEMCACHE_SRV", "MEMCACHE_SRV_REFRESH", "MEMCACHE_TLS",
		"MEMCACHE_TLS_CLIENT_CERT", "MEMCACHE_TLS_CLIENT_KEY", "MEMCACHE_TLS_CACERT", "MEMCACHE_TLS_SKIP_HOSTNAME_VERIFICATION",
		"REDIS_*", "MEMCACHE_*")...)
	t = append(t, ignored(whyOverLimit, "STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT")...)
	t = append(t, ignored(whyStats,
		"USE_STATSD", "STATSD_HOST", "STATSD_PORT", "USE_DOG_STATSD", "USE_DOG_STATSD_MOGRIFIERS", "EXTRA_TAGS",
		"STATS_FLUSH_INTERVAL", "DISABLE_STATS", "DOG_STATSD_MOGRIFIER_*", "GOSTATS_*")...)
	t = append(t, ignored(whyMapper, "PROMETHEUS_MAPPER_YAML")...)
	t = append(t, ignored(whyTracing,
		"TRACING_ENABLED", "TRACING_SERVICE_NAME", "TRACING_SERVICE_NAMESPACE", "TRACING_SERVICE_INSTANCE_ID",
		"TRACING_EXPORTER_PROTOCOL", "TRACING_SAMPLING_RATE", "OTEL_*")...)
	return t
}
