package examples_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// unitFile is a systemd unit: section -> key -> every value given, in order.
type unitFile map[string]map[string][]string

// parseUnit reads a unit file the way systemd does for what these checks need:
// sections, repeated keys, backslash continuations, # and ; comments.
func parseUnit(data string) unitFile {
	u := unitFile{}
	section := ""
	var cont strings.Builder
	for _, line := range strings.Split(data, "\n") {
		line = strings.TrimSpace(line)
		if cont.Len() == 0 && (line == "" || line[0] == '#' || line[0] == ';') {
			continue
		}
		if c, ok := strings.CutSuffix(line, `\`); ok {
			cont.WriteString(c + " ")
			continue
		}
		cont.WriteString(line)
		line = strings.TrimSpace(cont.String())
		cont.Reset()
		if strings.HasPrefix(line, "[") && strings.HasSuffix(line, "]") {
			section = line[1 : len(line)-1]
			continue
		}
		k, v, _ := strings.Cut(line, "=")
		if u[section] == nil {
			u[section] = map[string][]string{}
		}
		u[section][strings.TrimSpace(k)] = append(u[section][strings.TrimSpace(k)], strings.TrimSpace(v))
	}
	return u
}

// last is the value in force for a key (the last one given), and whether any was.
func (u unitFile) last(section, key string) (string, bool) {
	v := u[section][key]
	if len(v) == 0 {
		return "", false
	}
	return v[len(v)-1], true
}

// checkUnit checks the unit runs `sharelimit serve` with flags and variables
// that exist, on loopback, hardened, and stops within TimeoutStopSec.
func checkUnit(p *problems, data string) {
	const where = "examples/systemd/sharelimit.service"
	u := parseUnit(data)
	exec, _ := u.last("Service", "ExecStart")
	argv := strings.Fields(strings.TrimLeft(exec, "-@+!:"))
	if len(argv) == 0 || filepath.Base(argv[0]) != "sharelimit" {
		p.addf("%s: ExecStart=%q does not run sharelimit", where, exec)
		return
	}
	env := map[string]string{}
	for _, line := range u["Service"]["Environment"] {
		for _, kv := range strings.Fields(line) {
			k, v, _ := strings.Cut(strings.Trim(kv, `"`), "=")
			env[k] = v
		}
	}
	// StateDirectory= is /var/lib/NAME, kept and writable under
	// ProtectSystem=strict and DynamicUser=yes.
	states := map[string]bool{}
	for _, d := range u["Service"]["StateDirectory"] {
		for _, name := range strings.Fields(d) {
			states["/var/lib/"+name] = true
		}
	}
	cfg := checkDaemon(p, daemon{where: where, args: argv[1:], env: env, stateDirs: states,
		mounts: map[string]string{"/etc/sharelimit/config": filepath.Join(repo, "examples", "config")}})

	for _, want := range []struct{ key, value string }{
		{"DynamicUser", "yes"},
		{"ProtectSystem", "strict"},
		{"ProtectHome", "yes"},
		{"PrivateTmp", "yes"},
		{"NoNewPrivileges", "yes"},
		{"CapabilityBoundingSet", ""},
		{"RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"},
		{"KillSignal", "SIGTERM"},
	} {
		if got, ok := u.last("Service", want.key); !ok || got != want.value {
			p.addf("%s: want %s=%s, got %q", where, want.key, want.value, got)
		}
	}
	if _, ok := u.last("Service", "ExecReload"); ok {
		p.addf("%s: ExecReload: the daemon reloads on its own when --config-dir changes, and a SIGHUP would stop it", where)
	}
	if cfg == nil {
		return
	}
	for _, l := range []struct{ flag, addr string }{{"--grpc-addr", cfg.GRPCAddr}, {"--http-addr", cfg.HTTPAddr}} {
		if !isLoopbackAddr(l.addr) {
			p.addf("%s: %s %s is not loopback", where, l.flag, l.addr)
		}
	}
	if cfg.AllowRemote {
		p.addf("%s: --allow-remote: the unit is loopback only", where)
	}
	if addr := env["CONSUL_HTTP_ADDR"]; cfg.ConsulService != "" && !isLoopbackAddr(addr) {
		p.addf("%s: CONSUL_HTTP_ADDR=%s: the node's own agent is on loopback (and IPAddressAllow=localhost forbids anything else)", where, addr)
	}
	stop, _ := u.last("Service", "TimeoutStopSec")
	d, err := time.ParseDuration(stop)
	if err != nil {
		p.addf("%s: TimeoutStopSec=%q: want a duration such as 30s", where, stop)
	} else if d <= stopBudget(cfg) {
		p.addf("%s: TimeoutStopSec=%s does not outlast --drain %s + --shutdown-timeout %s", where, d, cfg.Drain, cfg.ShutdownTimeout)
	}
}

func TestSystemdUnit(t *testing.T) {
	t.Parallel()
	var p problems
	checkUnit(&p, string(readFile(t, "examples/systemd/sharelimit.service")))
	p.report(t)
}

// TestSystemdAnalyze asks systemd itself: every directive is known and well
// formed (verify), and the sandbox keeps its exposure score low (security).
func TestSystemdAnalyze(t *testing.T) {
	t.Parallel()
	var p problems
	systemdAnalyze(t, &p, readFile(t, "examples/systemd/sharelimit.service"))
	p.report(t)
}

// systemdAnalyze runs systemd-analyze verify and security on a unit. `make test`
// installs systemd-analyze where it is missing (the Makefile's deps target).
func systemdAnalyze(t *testing.T, p *problems, unitData []byte) {
	t.Helper()
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Fatal("systemd-analyze is not installed: run make deps (Debian's systemd package)")
	}
	// A root directory where the unit and its binary are where the unit says.
	root := t.TempDir()
	unitDir := filepath.Join(root, "etc", "systemd", "system")
	binDir := filepath.Join(root, "usr", "local", "bin")
	for _, d := range []string{unitDir, binDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(unitDir, "sharelimit.service"), unitData, 0o644); err != nil {
		t.Fatal(err)
	}
	// A copy, not a symlink: verify resolves links inside --root.
	built := testutil.Build(t, command)
	if err := os.Link(built, filepath.Join(binDir, "sharelimit")); err != nil {
		bin, err := os.ReadFile(built)
		if err == nil {
			err = os.WriteFile(filepath.Join(binDir, "sharelimit"), bin, 0o755)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	unit := "/etc/systemd/system/sharelimit.service"

	out, _ := exec.Command(analyze, "verify", "--root="+root, unit).CombinedOutput()
	for _, line := range strings.Split(string(out), "\n") {
		// Without a booted system the default dependencies are missing; that is
		// the only complaint to expect.
		if line == "" || strings.Contains(line, "sysinit.target") {
			continue
		}
		p.addf("systemd-analyze verify: %s", line)
	}

	// --threshold counts in tenths of the score it prints: 20 is "2.0".
	out, err = exec.Command(analyze, "security", "--offline=yes", "--root="+root, "--threshold=20", unit).CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "unrecognized option") {
			t.Fatalf("this systemd-analyze has no offline security (systemd ≥ 250 needed): %s", out)
		}
		p.addf("systemd-analyze security: the unit's exposure is above 2.0: %v\n%s", err, out)
	}
}
