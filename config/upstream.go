package config

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/sharelimit/sharelimit/internal/human"
)

// Applying the table: what each variable that is set does to the settings,
// and the notices that say so.

// What happened to one variable that is set.
type outcomeKind int

const (
	applied    outcomeKind = iota + 1 // it set its flag
	overridden                        // a flag or SHARELIMIT_* variable set the flag first
	accepted                          // harmless: it asks for what sharelimit does anyway
	ignoredVar                        // it has no effect; why says why
)

type outcome struct {
	kind outcomeKind
	why  string
}

// upstreamEnv applies upstream's variables to one FlagSet.
type upstreamEnv struct {
	fs       *flag.FlagSet
	c        *Config
	getenv   func(string) string
	given    map[string]bool // flags set by a flag or a SHARELIMIT_* variable
	rows     map[string]*upstreamVar
	status   map[string]outcome
	reported map[string]bool // variables whose bad value is already an error
	family   []string        // set variables known only by a family's prefix
	remote   []string        // host variables applied that are not loopback
	errs     []error
}

// applyUpstream sets, from upstream's variables, every flag of fs that no flag
// or SHARELIMIT_* variable has set, and returns what it did as notices.
// names, when not nil, lists every variable set, so families can be named.
func applyUpstream(fs *flag.FlagSet, c *Config, getenv func(string) string, names []string, asCommand bool) ([]Notice, error) {
	getenv = withoutServiceLinks(getenv) // see servicelinks.go
	u := &upstreamEnv{fs: fs, c: c, getenv: getenv, given: map[string]bool{}, rows: map[string]*upstreamVar{}, status: map[string]outcome{}, reported: map[string]bool{}}
	fs.Visit(func(f *flag.Flag) { u.given[f.Name] = true })
	for i := range upstreamTable {
		u.rows[upstreamTable[i].Name] = &upstreamTable[i]
	}
	c.UpstreamBy = upstreamBy(getenv, asCommand)

	// Table order is the order of dependence: CONFIG_TYPE before the xDS
	// rows, each gate before the rows behind it.
	for i := range upstreamTable {
		v := &upstreamTable[i]
		if v.conv == nil || u.val(v.Name) == "" || u.closed(v) {
			continue
		}
		if u.given[v.flag] {
			u.status[v.Name] = outcome{kind: overridden}
			continue
		}
		val, err := v.conv(u.val(v.Name))
		if err == nil {
			err = fs.Set(v.flag, val)
		}
		if err != nil {
			u.fail(v.Name, err)
			continue
		}
		u.status[v.Name] = outcome{kind: applied}
	}
	u.listeners()
	u.prometheus()
	u.runtime()
	u.grpcTLS()
	u.jitter()

	// What is left set is ignored; a gate's rows were handled above.
	for i := range upstreamTable {
		v := &upstreamTable[i]
		if _, done := u.status[v.Name]; done || strings.HasSuffix(v.Name, "*") || u.val(v.Name) == "" {
			continue
		}
		switch {
		case v.harmless:
			u.status[v.Name] = outcome{kind: accepted}
		case v.group != "":
			u.status[v.Name] = outcome{kind: ignoredVar, why: v.group}
		}
	}
	for _, n := range names {
		if _, exact := u.rows[n]; exact || getenv(n) == "" {
			continue
		}
		for i := range upstreamTable {
			if p, ok := strings.CutSuffix(upstreamTable[i].Name, "*"); ok && strings.HasPrefix(n, p) {
				u.family = append(u.family, n)
				u.status[n] = outcome{kind: ignoredVar, why: upstreamTable[i].group}
				break
			}
		}
	}
	slices.Sort(u.family)
	if len(u.errs) > 0 {
		return nil, errors.Join(u.errs...)
	}
	return u.notices(), nil
}

// upstreamBy lists what puts the daemon in upstream's mode: upstream's
// command, first, when the binary was run as it (asCommand), and the variables
// set, by their exact names, that only envoyproxy/ratelimit reads. HOST, PORT,
// LOG_LEVEL and LOG_FORMAT are any program's; and a family's prefix proves
// nothing, since Kubernetes sets REDIS_SERVICE_HOST in every pod of a
// namespace with a Service named redis. Empty: not in upstream's mode.
func upstreamBy(getenv func(string) string, asCommand bool) []string {
	var by []string
	if asCommand {
		by = append(by, upstreamCommand)
	}
	for _, v := range upstreamTable {
		if !genericVar[v.Name] && !strings.HasSuffix(v.Name, "*") && getenv(v.Name) != "" {
			by = append(by, v.Name)
		}
	}
	return by
}

// UpstreamBy is Config.UpstreamBy for an environment given as os.Environ
// gives it, for a caller whose settings could not be parsed (serve logs that
// error in upstream's JSON when the environment is upstream's).
func UpstreamBy(environ []string, asCommand bool) []string {
	return upstreamBy(withoutServiceLinks(Getenv(environ)), asCommand)
}

// val is a variable's value; empty counts as unset, as for ApplyEnv. Only
// table names are read (TestParseReadsOnlyTheTable), so the documentation
// cannot miss one.
func (u *upstreamEnv) val(name string) string { return u.getenv(name) }

// fail records a bad value, once per variable, naming it.
func (u *upstreamEnv) fail(name string, err error) {
	if !u.reported[name] {
		u.reported[name] = true
		u.errs = append(u.errs, fmt.Errorf("%s: %w", name, err))
	}
}

// mark records what happened to the named variables that are set.
func (u *upstreamEnv) mark(o outcome, names ...string) {
	for _, n := range names {
		if u.val(n) != "" {
			u.status[n] = o
		}
	}
}

// on reads a switch variable; unset is off, and a bad value is an error.
func (u *upstreamEnv) on(name string) bool {
	v := u.val(name)
	if v == "" {
		return false
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		u.fail(name, fmt.Errorf("want true or false, got %q", v))
	}
	return b
}

// closed reports whether v's gate is off, marking v ignored for that reason.
func (u *upstreamEnv) closed(v *upstreamVar) bool {
	xds := u.c.ConfigType == ConfigXDS
	open, why := true, ""
	switch v.gate {
	case gateXDS:
		open, why = xds, whyXDSOff
	case gateGRPCTLS:
		open, why = u.on("GRPC_SERVER_USE_TLS"), whyTLSOff
	case gateProm:
		open, why = u.on("USE_PROMETHEUS"), whyPromOff
	case gateXDSTLS:
		// The switch may come from --xds-tls too; and it is itself an xDS row.
		open, why = xds && u.c.XDSTLS, whyXDSTLSOff
		if !xds {
			why = whyXDSOff
		}
	}
	if !open {
		u.status[v.Name] = outcome{kind: ignoredVar, why: why}
	}
	return !open
}

// set gives flag the value the named variables make, unless a flag or a
// SHARELIMIT_* variable gave it first. It reports whether it did.
func (u *upstreamEnv) set(flag, value string, names ...string) bool {
	if u.given[flag] {
		u.mark(outcome{kind: overridden}, names...)
		return false
	}
	if err := u.fs.Set(flag, value); err != nil {
		u.fail(names[0], err)
		return false
	}
	u.mark(outcome{kind: applied}, names...)
	return true
}

// listeners maps GRPC_*, HOST/PORT and DEBUG_* to the three addresses. In
// upstream's mode (Config.UpstreamBy) the three listen where upstream's did,
// on every address at 8081, 8080 and 6070, unless a flag or a SHARELIMIT_*
// variable names the address; a host or port variable changes its part.
// Otherwise a host or port variable changes its part of the loopback default.
func (u *upstreamEnv) listeners() {
	up := len(u.c.UpstreamBy) > 0
	host := func(loopback string) string {
		if up {
			return upstreamHost
		}
		return loopback
	}
	if uds := u.val("GRPC_UDS"); uds != "" {
		if u.given["grpc-addr"] {
			u.mark(outcome{kind: overridden}, "GRPC_UDS", "GRPC_HOST", "GRPC_PORT")
		} else if u.set("grpc-addr", "unix:"+uds, "GRPC_UDS") {
			u.mark(outcome{kind: ignoredVar, why: whyUDS}, "GRPC_HOST", "GRPC_PORT")
		}
	} else {
		u.listener("grpc-addr", "GRPC_HOST", "GRPC_PORT", net.JoinHostPort(host("127.0.0.1"), "8081"), up)
	}
	u.listener("http-addr", "HOST", "PORT", net.JoinHostPort(host("127.0.0.1"), "8080"), up)
	u.listener("debug-addr", "DEBUG_HOST", "DEBUG_PORT", net.JoinHostPort(host("127.0.0.1"), upstreamDebugPort), up)
	if len(u.remote) > 0 && !u.given["allow-remote"] {
		u.fs.Set("allow-remote", "true") // the operator asked for a host beyond loopback
	}
}

// listener sets flag from a host and a port variable; the one not set comes
// from def. With always, def applies even when neither is set.
func (u *upstreamEnv) listener(flag, hostVar, portVar, def string, always bool) {
	host, port := u.val(hostVar), u.val(portVar)
	if host == "" && port == "" && !always {
		return
	}
	if u.given[flag] {
		u.mark(outcome{kind: overridden}, hostVar, portVar)
		return
	}
	bad := false
	if port != "" {
		if _, err := strconv.ParseUint(port, 10, 16); err != nil {
			u.fail(portVar, fmt.Errorf("want a port number, got %q", port))
			bad = true
		}
	}
	if host != "" && net.ParseIP(host) == nil && !validHostname(host) {
		u.fail(hostVar, fmt.Errorf("want an IP address or a host name, got %q", host))
		bad = true
	}
	if bad {
		return
	}
	defHost, defPort, _ := net.SplitHostPort(def)
	h, p := host, port
	if h == "" {
		h = defHost
	}
	if p == "" {
		p = defPort
	}
	if !u.set(flag, net.JoinHostPort(h, p), hostVar, portVar) {
		return
	}
	if !IsLoopback(h) {
		u.remote = append(u.remote, flag)
	}
}

// runtime maps RUNTIME_* to --config-dir, as upstream joins them.
func (u *upstreamEnv) runtime() {
	parts := []string{"RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_APPDIRECTORY"}
	if u.c.ConfigType == ConfigXDS {
		u.mark(outcome{kind: ignoredVar, why: whyNoDir}, append(parts, "RUNTIME_WATCH_ROOT", "RUNTIME_IGNOREDOTFILES")...)
		return
	}
	// Accepted as they are, but a value upstream could not parse is an error.
	for _, n := range []string{"RUNTIME_WATCH_ROOT", "RUNTIME_IGNOREDOTFILES"} {
		u.on(n)
	}
	root, sub, app := u.val(parts[0]), u.val(parts[1]), u.val(parts[2])
	if root == "" && sub == "" && app == "" {
		return
	}
	if root == "" {
		root = upstreamRuntimeRoot
	}
	if app == "" {
		app = upstreamAppDir
	}
	if u.set("config-dir", filepath.Join(root, sub, app), parts...) && !u.given["config-all-files"] {
		u.c.ConfigAllFiles = true // the directory is upstream's, so read it as upstream does
	}
}

// grpcTLS checks what GRPC_SERVER_USE_TLS=true needs once its rows applied.
func (u *upstreamEnv) grpcTLS() {
	// false, upstream's default, is not worth a line: the rows it closes
	// are reported as ignored.
	if !u.on("GRPC_SERVER_USE_TLS") {
		return
	}
	u.status["GRPC_SERVER_USE_TLS"] = outcome{kind: applied}
	if u.c.GRPCTLSCert == "" || u.c.GRPCTLSKey == "" {
		u.fail("GRPC_SERVER_USE_TLS", errors.New("true needs GRPC_SERVER_TLS_CERT and GRPC_SERVER_TLS_KEY (or --grpc-tls-cert and --grpc-tls-key)"))
	}
	if u.c.GRPCTLSClientSAN != "" && u.c.GRPCTLSClientCA == "" && u.status["GRPC_CLIENT_TLS_SAN"].kind == applied {
		u.fail("GRPC_CLIENT_TLS_SAN", errors.New("needs GRPC_CLIENT_TLS_CACERT: the name is checked in a verified client certificate"))
	}
}

// jitter applies XDS_CLIENT_BACKOFF_JITTER=false: no randomness at all.
func (u *upstreamEnv) jitter() {
	const name = "XDS_CLIENT_BACKOFF_JITTER"
	v := u.rows[name]
	if u.val(name) == "" || u.closed(v) {
		return
	}
	if u.given[v.flag] {
		u.mark(outcome{kind: overridden}, name)
		return
	}
	if !u.on(name) && !u.reported[name] {
		u.fs.Set(v.flag, "0")
	}
	u.mark(outcome{kind: applied}, name)
}

// notices turns the outcomes into what the operator reads, in a fixed order:
// applied, overridden, still on loopback, beyond loopback, accepted, ignored.
func (u *upstreamEnv) notices() []Notice {
	var out []Notice
	// byTarget lists the variables of one kind grouped by the flag they feed:
	// "PORT -> --http-addr; GRPC_PORT -> --grpc-addr".
	byTarget := func(kind outcomeKind) (string, []string) {
		var targets []string
		vars := map[string][]string{}
		for _, v := range upstreamTable {
			if u.status[v.Name].kind != kind {
				continue
			}
			if _, ok := vars[v.To]; !ok {
				targets = append(targets, v.To)
			}
			vars[v.To] = append(vars[v.To], v.Name)
		}
		var parts, all []string
		for _, t := range targets {
			parts = append(parts, strings.Join(vars[t], ", ")+" -> "+t)
			all = append(all, vars[t]...)
		}
		return strings.Join(parts, "; "), all
	}
	if msg, vars := byTarget(applied); len(vars) > 0 {
		out = append(out, Notice{Level: slog.LevelInfo, Message: "upstream variables applied: " + msg, Vars: vars})
	}
	if msg, vars := byTarget(overridden); len(vars) > 0 {
		out = append(out, Notice{Level: slog.LevelInfo, Message: "upstream variables overridden by flags or SHARELIMIT_* variables: " + msg, Vars: vars})
	}
	if len(u.remote) > 0 && u.c.AllowRemote {
		var why string
		if len(u.c.UpstreamBy) > 0 {
			why = "upstream's environment (" + human.Names(u.c.UpstreamBy) + "), so listening where upstream listened"
		} else {
			why = "upstream's host variables ask for it"
		}
		flags := make([]string, len(u.remote))
		for i, f := range u.remote {
			flags[i] = "--" + f + " " + u.fs.Lookup(f).Value.String()
		}
		out = append(out, Notice{Level: slog.LevelInfo, Vars: u.c.UpstreamBy, Message: "beyond loopback: " + why + ": " +
			strings.Join(flags, ", ") + "; set " + EnvName("grpc-addr") + ", " + EnvName("http-addr") + " and " + EnvName("debug-addr") +
			" (or GRPC_HOST, HOST and DEBUG_HOST) to 127.0.0.1 addresses to keep them on loopback"})
	}
	var acc, accMsg []string
	for _, v := range upstreamTable {
		if u.status[v.Name].kind == accepted {
			acc = append(acc, v.Name)
			accMsg = append(accMsg, v.Name+" ("+strings.TrimPrefix(v.Why, whyAccepted)+")")
		}
	}
	if len(acc) > 0 {
		out = append(out, Notice{Level: slog.LevelInfo, Message: "upstream variables " + whyAccepted + strings.Join(accMsg, "; "), Vars: acc})
	}
	groups := map[string][]string{}
	for _, v := range upstreamTable {
		if o := u.status[v.Name]; o.kind == ignoredVar {
			groups[o.why] = append(groups[o.why], v.Name)
		}
	}
	for _, n := range u.family {
		o := u.status[n]
		groups[o.why] = append(groups[o.why], n)
	}
	var parts, ign []string
	for _, why := range warnOrder {
		if names := groups[why]; len(names) > 0 {
			parts = append(parts, why+" ("+strings.Join(names, ", ")+")")
			ign = append(ign, names...)
		}
	}
	if len(ign) > 0 {
		out = append(out, Notice{Level: slog.LevelWarn, Message: "upstream variables ignored: " + strings.Join(parts, "; "), Vars: ign})
	}
	return out
}
