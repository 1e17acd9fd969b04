// Package config holds the daemon's settings. They are read once, at start-up,
// from flags and SHARELIMIT_* environment variables (a flag wins over its
// variable), and checked by Validate before anything starts. Nothing re-reads
// the environment later: a running daemon's settings are exactly what it logged
// at start. ApplyEnv, the rule that maps flags to variables, is shared with the
// other subcommands that read their flags from the environment (sharelimit
// bench).
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

// Config is the daemon's settings. The zero value is not valid; use Parse.
type Config struct {
	GRPCAddr    string
	HTTPAddr    string
	AllowRemote bool

	GRPCTLSCert     string
	GRPCTLSKey      string
	GRPCTLSClientCA string

	ConfigDir      string
	ReloadDebounce time.Duration

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

	ShadowMode      bool
	ResponseHeaders bool
	HeaderLimit     string
	HeaderRemaining string
	HeaderReset     string

	Drain           time.Duration
	ShutdownTimeout time.Duration

	LogFormat string
	LogLevel  string
}

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

// FlagSet returns the serve flags bound to c, with their defaults. It is exported
// so documentation and tests can list exactly the flags that exist.
func (c *Config) FlagSet(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.StringVar(&c.GRPCAddr, "grpc-addr", "127.0.0.1:8081", "gRPC listen address (host:port, or unix:/path)")
	fs.StringVar(&c.HTTPAddr, "http-addr", "127.0.0.1:8080", "admin HTTP listen address: /healthcheck, /json, /rlconfig, /metrics, /debug/pprof/")
	fs.BoolVar(&c.AllowRemote, "allow-remote", false, "allow listening on non-loopback addresses (logged as a warning)")
	fs.StringVar(&c.GRPCTLSCert, "grpc-tls-cert", "", "PEM certificate for gRPC TLS (with --grpc-tls-key)")
	fs.StringVar(&c.GRPCTLSKey, "grpc-tls-key", "", "PEM private key for gRPC TLS")
	fs.StringVar(&c.GRPCTLSClientCA, "grpc-tls-client-ca", "", "PEM CA bundle: require and verify client certificates (mTLS)")
	fs.StringVar(&c.ConfigDir, "config-dir", "/etc/sharelimit/config", "directory of descriptor YAML files (*.yaml, *.yml; dotfiles ignored), watched for changes")
	fs.Var(seconds{&c.ReloadDebounce}, "reload-debounce", "wait this long after the last change in --config-dir before reloading")
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
	}
	c.FlagSet("defaults") // binds and applies the flag defaults
	return c
}

// Parse reads flags from args and, for every flag not given, its SHARELIMIT_*
// variable from getenv. Usage goes to out. It does not validate; call Validate.
func Parse(name string, args []string, getenv func(string) string, out io.Writer) (*Config, error) {
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
	return c, nil
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
	for _, l := range []struct{ flag, addr string }{{"grpc-addr", c.GRPCAddr}, {"http-addr", c.HTTPAddr}} {
		if l.flag == "grpc-addr" && strings.HasPrefix(l.addr, "unix:") {
			if strings.TrimPrefix(l.addr, "unix:") == "" {
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
	}
	if (c.GRPCTLSCert == "") != (c.GRPCTLSKey == "") {
		bad("grpc-tls-cert", "--grpc-tls-cert and --grpc-tls-key go together")
	}
	if c.GRPCTLSClientCA != "" && c.GRPCTLSCert == "" {
		bad("grpc-tls-client-ca", "client verification needs --grpc-tls-cert and --grpc-tls-key")
	}
	for _, f := range []struct{ flag, path string }{{"grpc-tls-cert", c.GRPCTLSCert}, {"grpc-tls-key", c.GRPCTLSKey}, {"grpc-tls-client-ca", c.GRPCTLSClientCA}} {
		if f.path != "" {
			if _, err := os.Stat(f.path); err != nil {
				bad(f.flag, "%v", err)
			}
		}
	}
	if c.ConfigDir == "" {
		bad("config-dir", "must not be empty")
	} else if fi, err := os.Stat(c.ConfigDir); err != nil {
		bad("config-dir", "%v", err)
	} else if !fi.IsDir() {
		bad("config-dir", "%s is not a directory", c.ConfigDir)
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
