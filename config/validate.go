package config

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Validate reports every setting that cannot work, together, in the order
// of the subjects below: what it serves, TLS, where the rules come from,
// membership, and the rest.
func (c *Config) Validate() error {
	var errs []error
	bad := func(flag, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, args...)))
	}
	c.validateListeners(bad)
	c.validateTLS(bad)
	c.validateRules(bad)
	c.validateMembership(bad)
	c.validateRuntime(bad)
	return errors.Join(errs...)
}

// badFunc reports one problem with a flag's setting.
type badFunc = func(flag, format string, args ...any)

// listener is one listening flag and its address.
type listener struct{ flag, addr string }

// listeners lists the listeners set, and checks that the one serving every
// admin page to loopback is on loopback.
func (c *Config) listeners(bad badFunc) []listener {
	out := []listener{{"grpc-addr", c.GRPCAddr}, {"http-addr", c.HTTPAddr}}
	if c.DebugAddr != "" {
		out = append(out, listener{"debug-addr", c.DebugAddr})
	}
	if c.LocalHTTPAddr != "" {
		out = append(out, listener{"local-http-addr", c.LocalHTTPAddr})
		if host, _, err := net.SplitHostPort(c.LocalHTTPAddr); err == nil && !IsLoopback(host) {
			bad("local-http-addr", "%s is not a loopback address: it serves every admin page, pprof included", host)
		}
	}
	if c.MetricsAddr != "" {
		out = append(out, listener{"metrics-addr", c.MetricsAddr})
	}
	return out
}

// validateListeners checks what the daemon serves: the transport, each
// listener's address, and that no two listeners clash.
func (c *Config) validateListeners(bad badFunc) {
	if c.GRPCTransport != TransportDirect && c.GRPCTransport != TransportGRPCGo {
		bad("grpc-transport", "must be %s or %s, got %q", TransportDirect, TransportGRPCGo, c.GRPCTransport)
	}
	var bound []bind
	for _, l := range c.listeners(bad) {
		bound = c.checkListener(l, bound, bad)
	}
	if c.MetricsAddr != "" && !strings.HasPrefix(c.MetricsPath, "/") {
		bad("metrics-path", "want a path starting with /, got %q", c.MetricsPath)
	}
	if !(c.NearLimitRatio >= 0 && c.NearLimitRatio <= 1) {
		bad("near-limit-ratio", "want a ratio from 0 to 1, got %v", c.NearLimitRatio)
	}
}

// bind is a listener's host and port.
type bind struct{ flag, host, port string }

// checkListener checks l's address against the listeners bound before it,
// and returns them with l's.
func (c *Config) checkListener(l listener, bound []bind, bad badFunc) []bind {
	if strings.HasPrefix(l.addr, "unix:") {
		if l.flag != "grpc-addr" {
			bad(l.flag, "want host:port, got %q (only --grpc-addr takes unix:)", l.addr)
		} else if strings.TrimPrefix(l.addr, "unix:") == "" {
			bad(l.flag, "unix: needs a socket path")
		}
		return bound
	}
	host, port, err := net.SplitHostPort(l.addr)
	if err != nil {
		bad(l.flag, "want host:port, got %q", l.addr)
		return bound
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		bad(l.flag, "bad port %q", port)
	}
	// The metrics listener spends no limits and answers no requests:
	// Prometheus scrapes it from elsewhere, as upstream's :9090.
	if !IsLoopback(host) && !c.AllowRemote && l.flag != "metrics-addr" {
		bad(l.flag, "%s is not a loopback address; sharelimit runs beside Envoy on loopback (pass --allow-remote to listen elsewhere)", host)
	}
	// Port 0 picks a free port each time, so only a fixed port can clash.
	// Two listeners clash on one port when either takes every address
	// (0.0.0.0, ::, or no host) or both name the same host, localhost
	// being 127.0.0.1.
	for _, b := range bound {
		if port != "0" && port == b.port && (anyHost(host) || anyHost(b.host) || sameHost(host, b.host)) {
			bad(l.flag, "%s and --%s %s both listen on port %s", l.addr, b.flag, net.JoinHostPort(b.host, b.port), port)
		}
	}
	return append(bound, bind{l.flag, host, port})
}

// validateTLS checks the gRPC listener's TLS settings.
func (c *Config) validateTLS(bad badFunc) {
	if (c.GRPCTLSCert == "") != (c.GRPCTLSKey == "") {
		bad("grpc-tls-cert", "--grpc-tls-cert and --grpc-tls-key go together")
	}
	if c.GRPCTLSClientCA != "" && c.GRPCTLSCert == "" {
		bad("grpc-tls-client-ca", "client verification needs --grpc-tls-cert and --grpc-tls-key")
	}
	if c.GRPCTLSClientSAN != "" && c.GRPCTLSClientCA == "" {
		bad("grpc-tls-client-san", "needs --grpc-tls-client-ca: the name is checked in a verified client certificate")
	}
	checkFiles(bad, []struct{ flag, path string }{{"grpc-tls-cert", c.GRPCTLSCert}, {"grpc-tls-key", c.GRPCTLSKey}, {"grpc-tls-client-ca", c.GRPCTLSClientCA}})
}

// checkFiles reports each file named that cannot be found.
func checkFiles(bad badFunc, files []struct{ flag, path string }) {
	for _, f := range files {
		if f.path != "" {
			if _, err := os.Stat(f.path); err != nil {
				bad(f.flag, "%v", err)
			}
		}
	}
}

// validateRules checks where the rules come from: the xDS client's
// settings with xDS; else that none of them is given, and the directory.
func (c *Config) validateRules(bad badFunc) {
	switch c.ConfigType {
	case ConfigFile:
	case ConfigXDS:
		c.validateXDS(bad)
		return
	default:
		bad("config-type", "want FILE or GRPC_XDS_SOTW, got %q", c.ConfigType)
	}
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

// validateMembership checks how replicas are counted: the static count,
// the Consul services and their settings, demand sharing, and DNS.
func (c *Config) validateMembership(bad badFunc) {
	if c.Replicas < 1 {
		bad("replicas", "must be at least 1, got %d", c.Replicas)
	}
	if len(c.Services()) == 0 {
		for _, f := range []struct{ flag, v string }{{"consul-filter", c.ConsulFilter}, {"consul-datacenter", c.ConsulDatacenter}, {"node", c.Node}} {
			if f.v != "" {
				bad(f.flag, "has no effect without --consul-service or --domain-service")
			}
		}
	}
	c.validateServices(bad)
	c.validatePeersDNS(bad)
	if !(c.ConsulQueryRate > 0) {
		bad("consul-query-rate", "must be positive")
	}
	if c.ConsulWait < time.Second || c.ConsulWait > 10*time.Minute {
		bad("consul-wait", "must be between 1s and 10m (Consul caps it at 10m), got %s", c.ConsulWait)
	}
}

// validateRuntime checks the rest: buckets, reloads, shutdown, the state
// file, the join ramp, response headers and logging.
func (c *Config) validateRuntime(bad badFunc) {
	if c.MaxBuckets < 1 {
		bad("max-buckets", "must be at least 1")
	}
	if c.SweepInterval <= 0 {
		bad("sweep-interval", "must be positive")
	}
	c.validateRLQS(bad)
	if c.ReloadDebounce < 0 {
		bad("reload-debounce", "must not be negative")
	}
	if c.Drain < 0 || c.ShutdownTimeout < 0 {
		bad("drain", "durations must not be negative")
	}
	if c.StateMaxAge <= 0 {
		bad("state-max-age", "must be positive, got %s", c.StateMaxAge)
	}
	if c.StateInterval < 0 || (c.StateInterval > 0 && c.StateInterval < time.Second) {
		bad("state-interval", "must be 0 (off) or at least 1s, got %s", c.StateInterval)
	}
	if c.StateInterval > 0 && c.StateFile == "" {
		bad("state-interval", "needs --state-file")
	}
	if c.JoinRamp < 0 && c.JoinRamp != JoinRampAuto {
		bad("join-ramp", "must be auto, 0 (off) or a positive duration, got %s", c.JoinRamp)
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
}

// validateXDS checks the xDS client's settings, reporting through bad.
func (c *Config) validateXDS(bad badFunc) {
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
		checkFiles(bad, []struct{ flag, path string }{{"xds-tls-cert", c.XDSTLSCert}, {"xds-tls-key", c.XDSTLSKey}, {"xds-tls-ca", c.XDSTLSCA}})
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

// anyHost reports whether a listener on host takes every address.
func anyHost(host string) bool {
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
}

// sameHost reports whether two listener hosts are one, localhost being
// 127.0.0.1.
func sameHost(a, b string) bool {
	norm := func(h string) string {
		if strings.EqualFold(h, "localhost") {
			return "127.0.0.1"
		}
		if ip := net.ParseIP(h); ip != nil {
			return ip.String()
		}
		return strings.ToLower(h)
	}
	return norm(a) == norm(b)
}

// validateRLQS checks the RLQS settings. Envoy reads a time to live in whole
// seconds (under 1s expires at once) and reports every 5s, so a bucket must
// stay at least two reports before it counts as idle.
func (c *Config) validateRLQS(bad badFunc) {
	if c.RLQSTTL < MinRLQSTTL || c.RLQSTTL > time.Hour || c.RLQSTTL%time.Second != 0 {
		bad("rlqs-ttl", "must be whole seconds between %s and 1h (Envoy reports every 5s, and only the answer to a report renews an assignment), got %s", MinRLQSTTL, c.RLQSTTL)
	}
	if c.RLQSAbandonAfter < 10*time.Second || c.RLQSAbandonAfter > 24*time.Hour {
		bad("rlqs-abandon-after", "must be between 10s and 24h, got %s", c.RLQSAbandonAfter)
	}
}
