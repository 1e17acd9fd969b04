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
	"maps"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Config is the daemon's settings. The zero value is not valid; use Parse.
type Config struct {
	GRPCAddr    string
	HTTPAddr    string
	AllowRemote bool

	// DebugAddr is a second admin listener, as upstream's DEBUG_HOST:DEBUG_PORT;
	// empty means none.
	DebugAddr string

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

	LogFormat string
	LogLevel  string

	// Notices are what Parse found worth telling the operator at start-up,
	// about upstream's variables: which it applied, which it ignored and why.
	// They name variables, never their values. The caller logs them once the
	// logger exists.
	Notices []Notice
}

// The values of ConfigType.
const (
	ConfigFile = "FILE"          // rules from the files in ConfigDir
	ConfigXDS  = "GRPC_XDS_SOTW" // rules from an xDS management server (state of the world)
)

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
	fs.BoolVar(&c.AllowRemote, "allow-remote", false, "allow listening on non-loopback addresses (logged as a warning)")
	fs.StringVar(&c.GRPCTLSCert, "grpc-tls-cert", "", "PEM certificate for gRPC TLS (with --grpc-tls-key)")
	fs.StringVar(&c.GRPCTLSKey, "grpc-tls-key", "", "PEM private key for gRPC TLS")
	fs.StringVar(&c.DebugAddr, "debug-addr", "", "a second admin listener (pprof, /rlconfig, ...), as upstream's debug port; empty = none")
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
	fs.StringVar(&c.Node, "node", "", "this node's name in Consul (default: the local agent's node name)")
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
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn or error")
	return fs
}

// Defaults returns the settings with every default applied.
func Defaults() *Config {
	c := &Config{
		ReloadDebounce:  250 * time.Millisecond,
		ConsulWait:      time.Minute,
		SweepInterval:   10 * time.Second,
		Drain:           5 * time.Second,
		ShutdownTimeout: 10 * time.Second,
		// upstream's XDS_CLIENT_BACKOFF_* defaults
		XDSBackoffInitial: 10 * time.Second,
		XDSBackoffMax:     time.Minute,
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
	return parse(name, args, getenv, nil, out)
}

// ParseEnviron is Parse with the environment given as os.Environ gives it,
// "NAME=value" entries (the first of a repeated name counts, as for
// os.Getenv). Knowing every name set, it also names in Notices the variables
// of upstream's families that getenv cannot list (UpstreamVariables' names
// ending in "*").
func ParseEnviron(name string, args, environ []string, out io.Writer) (*Config, error) {
	vars := make(map[string]string, len(environ))
	var names []string
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
	return parse(name, args, func(k string) string { return vars[k] }, names, out)
}

// parse is Parse; names, when not nil, are all the variables set.
func parse(name string, args []string, getenv func(string) string, names []string, out io.Writer) (*Config, error) {
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
	notices, err := applyUpstream(fs, c, getenv, names)
	if err != nil {
		return nil, err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
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

// Validate reports every setting that cannot work, together.
func (c *Config) Validate() error {
	var errs []error
	bad := func(flag, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, args...)))
	}
	listeners := []struct{ flag, addr string }{{"grpc-addr", c.GRPCAddr}, {"http-addr", c.HTTPAddr}}
	if c.DebugAddr != "" {
		listeners = append(listeners, struct{ flag, addr string }{"debug-addr", c.DebugAddr})
	}
	bound := map[string]string{} // address -> the flag that listens there
	for _, l := range listeners {
		if strings.HasPrefix(l.addr, "unix:") {
			if l.flag != "grpc-addr" {
				bad(l.flag, "want host:port, got %q (only --grpc-addr takes unix:)", l.addr)
			} else if strings.TrimPrefix(l.addr, "unix:") == "" {
				bad(l.flag, "unix: needs a socket path")
			}
			continue
		}
		host, port, err := net.SplitHostPort(l.addr)
		if err != nil {
			bad(l.flag, "want host:port, got %q", l.addr)
			continue
		}
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			bad(l.flag, "bad port %q", port)
		}
		if !IsLoopback(host) && !c.AllowRemote {
			bad(l.flag, "%s is not a loopback address; sharelimit runs beside Envoy on loopback (pass --allow-remote to listen elsewhere)", host)
		}
		// Port 0 picks a free port each time, so only a fixed port can clash.
		if other, ok := bound[l.addr]; ok && port != "0" {
			bad(l.flag, "%s is also --%s", l.addr, other)
		}
		bound[l.addr] = l.flag
	}
	if (c.GRPCTLSCert == "") != (c.GRPCTLSKey == "") {
		bad("grpc-tls-cert", "--grpc-tls-cert and --grpc-tls-key go together")
	}
	if c.GRPCTLSClientCA != "" && c.GRPCTLSCert == "" {
		bad("grpc-tls-client-ca", "client verification needs --grpc-tls-cert and --grpc-tls-key")
	}
	if c.GRPCTLSClientSAN != "" && c.GRPCTLSClientCA == "" {
		bad("grpc-tls-client-san", "needs --grpc-tls-client-ca: the name is checked in a verified client certificate")
	}
	for _, f := range []struct{ flag, path string }{{"grpc-tls-cert", c.GRPCTLSCert}, {"grpc-tls-key", c.GRPCTLSKey}, {"grpc-tls-client-ca", c.GRPCTLSClientCA}} {
		if f.path != "" {
			if _, err := os.Stat(f.path); err != nil {
				bad(f.flag, "%v", err)
			}
		}
	}
	xds := false
	switch c.ConfigType {
	case ConfigFile:
	case ConfigXDS:
		xds = true
	default:
		bad("config-type", "want FILE or GRPC_XDS_SOTW, got %q", c.ConfigType)
	}
	if xds {
		c.validateXDS(bad)
	} else {
		// The xDS settings given, as the consul ones: a default is not given.
		d := Defaults()
		for _, f := range []struct {
			flag string
			set  bool
		}{
			{"xds-server-url", c.XDSServerURL != d.XDSServerURL},
			{"xds-node-id", c.XDSNodeID != d.XDSNodeID},
			{"xds-node-metadata", c.XDSNodeMetadata != ""},
			{"xds-headers", c.XDSHeaders != ""},
			{"xds-tls", c.XDSTLS},
			{"xds-tls-cert", c.XDSTLSCert != ""},
			{"xds-tls-key", c.XDSTLSKey != ""},
			{"xds-tls-ca", c.XDSTLSCA != ""},
			{"xds-tls-san", c.XDSTLSSAN != ""},
			{"xds-backoff-initial", c.XDSBackoffInitial != d.XDSBackoffInitial},
			{"xds-backoff-max", c.XDSBackoffMax != d.XDSBackoffMax},
			{"xds-backoff-jitter", c.XDSBackoffJitter != d.XDSBackoffJitter},
			{"xds-max-msg-size", c.XDSMaxMsgSize != d.XDSMaxMsgSize},
		} {
			if f.set {
				bad(f.flag, "has no effect without --config-type GRPC_XDS_SOTW")
			}
		}
		// The rules come from the directory only without xDS.
		if c.ConfigDir == "" {
			bad("config-dir", "must not be empty")
		} else if fi, err := os.Stat(c.ConfigDir); err != nil {
			bad("config-dir", "%v", err)
		} else if !fi.IsDir() {
			bad("config-dir", "%s is not a directory", c.ConfigDir)
		}
	}
	if c.Replicas < 1 {
		bad("replicas", "must be at least 1, got %d", c.Replicas)
	}
	if c.ConsulService == "" {
		for _, f := range []struct{ flag, v string }{{"consul-filter", c.ConsulFilter}, {"consul-datacenter", c.ConsulDatacenter}, {"node", c.Node}} {
			if f.v != "" {
				bad(f.flag, "has no effect without --consul-service")
			}
		}
	}
	if !(c.ConsulQueryRate > 0) {
		bad("consul-query-rate", "must be positive")
	}
	if c.ConsulWait < time.Second || c.ConsulWait > 10*time.Minute {
		bad("consul-wait", "must be between 1s and 10m (Consul caps it at 10m), got %s", c.ConsulWait)
	}
	if c.MaxBuckets < 1 {
		bad("max-buckets", "must be at least 1")
	}
	if c.SweepInterval <= 0 {
		bad("sweep-interval", "must be positive")
	}
	if c.ReloadDebounce < 0 {
		bad("reload-debounce", "must not be negative")
	}
	if c.Drain < 0 || c.ShutdownTimeout < 0 {
		bad("drain", "durations must not be negative")
	}
	for _, f := range []struct{ flag, v string }{{"header-limit", c.HeaderLimit}, {"header-remaining", c.HeaderRemaining}, {"header-reset", c.HeaderReset}} {
		if !validHeader(f.v) {
			bad(f.flag, "%q is not a valid header name", f.v)
		}
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("log-format", "want text or json, got %q", c.LogFormat)
	}
	switch strings.ToLower(c.LogLevel) {
	case "debug", "info", "warn", "error":
	default:
		bad("log-level", "want debug, info, warn or error, got %q", c.LogLevel)
	}
	return errors.Join(errs...)
}

// validateXDS checks the xDS client's settings, reporting through bad.
func (c *Config) validateXDS(bad func(flag, format string, args ...any)) {
	if c.XDSServerURL == "" {
		bad("xds-server-url", "must not be empty")
	}
	if c.XDSNodeID == "" {
		bad("xds-node-id", "must not be empty")
	}
	if _, err := ParseKeyValues(c.XDSNodeMetadata); err != nil {
		eachError(err, func(err error) { bad("xds-node-metadata", "%v", err) })
	}
	if headers, err := ParseKeyValues(c.XDSHeaders); err != nil {
		eachError(err, func(err error) { bad("xds-headers", "%v", err) })
	} else {
		// gRPC sends metadata keys in lower case: X-A and x-a are one header.
		seen := map[string]bool{}
		for _, k := range slices.Sorted(maps.Keys(headers)) {
			lk := strings.ToLower(k)
			switch {
			case !validMetadataKey(lk):
				bad("xds-headers", "%q is not a valid gRPC metadata key (letters, digits, '-', '_', '.')", k)
			case seen[lk]:
				bad("xds-headers", "%q is given twice", lk)
			case !strings.HasSuffix(lk, "-bin") && !printableASCII(headers[k]):
				bad("xds-headers", "the value of %q must be printable ASCII", k)
			}
			seen[lk] = true
		}
	}
	if !c.XDSTLS {
		for _, f := range []struct{ flag, v string }{{"xds-tls-cert", c.XDSTLSCert}, {"xds-tls-key", c.XDSTLSKey}, {"xds-tls-ca", c.XDSTLSCA}, {"xds-tls-san", c.XDSTLSSAN}} {
			if f.v != "" {
				bad(f.flag, "has no effect without --xds-tls")
			}
		}
	} else {
		if (c.XDSTLSCert == "") != (c.XDSTLSKey == "") {
			bad("xds-tls-cert", "--xds-tls-cert and --xds-tls-key go together")
		}
		for _, f := range []struct{ flag, path string }{{"xds-tls-cert", c.XDSTLSCert}, {"xds-tls-key", c.XDSTLSKey}, {"xds-tls-ca", c.XDSTLSCA}} {
			if f.path != "" {
				if _, err := os.Stat(f.path); err != nil {
					bad(f.flag, "%v", err)
				}
			}
		}
	}
	if c.XDSBackoffInitial <= 0 {
		bad("xds-backoff-initial", "must be positive")
	} else if c.XDSBackoffMax < c.XDSBackoffInitial {
		bad("xds-backoff-max", "must be at least --xds-backoff-initial (%s), got %s", c.XDSBackoffInitial, c.XDSBackoffMax)
	}
	if !(c.XDSBackoffJitter >= 0 && c.XDSBackoffJitter <= 1) {
		bad("xds-backoff-jitter", "must be between 0 and 1, got %v", c.XDSBackoffJitter)
	}
	if c.XDSMaxMsgSize < 0 {
		bad("xds-max-msg-size", "must not be negative")
	}
}

// eachError calls f with each error joined in err (errors.Join), or err itself.
func eachError(err error, f func(error)) {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			f(e)
		}
		return
	}
	f(err)
}

func validMetadataKey(k string) bool {
	if k == "" {
		return false
	}
	for _, r := range k {
		if !(r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z') {
			return false
		}
	}
	return true
}

func printableASCII(s string) bool {
	for _, r := range s {
		if r < 0x20 || r > 0x7e {
			return false
		}
	}
	return true
}

// IsLoopback reports whether host names only this machine.
func IsLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

func validHeader(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if r > 127 || !(r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return false
		}
	}
	return true
}
