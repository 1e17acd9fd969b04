package examples_test

import (
	"bytes"
	"crypto/sha256"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// repo is the repository root, relative to this package's directory.
const repo = ".."

// command is the daemon's import path, built once for the package by
// testutil.Build.
const command = "github.com/sharelimit/sharelimit/cmd/sharelimit"

func TestMain(m *testing.M) {
	code := m.Run()
	testutil.RemoveBuilds()
	os.Exit(code)
}

// problems collects what a guard found wrong.
type problems []string

func (p *problems) addf(format string, args ...any) {
	*p = append(*p, fmt.Sprintf(format, args...))
}

// report fails t with every problem.
func (p problems) report(t *testing.T) {
	t.Helper()
	for _, s := range p {
		t.Error(s)
	}
}

// readFile reads a repository file, failing the test when it is missing.
func readFile(t *testing.T, rel string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repo, rel))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// daemon is one way a deployment file runs `sharelimit serve`.
type daemon struct {
	where string            // names the deployment in messages
	args  []string          // what follows the binary: "serve" (optional) and flags
	env   map[string]string // the environment the deployment gives the process
	// mounts maps a path as the process sees it to the repository path that is
	// mounted there, so Validate can look at the real files.
	mounts map[string]string
	// helperEnv names variables that exist only to be expanded into others
	// (Kubernetes' $(VAR)); they need not mean anything to the daemon.
	helperEnv map[string]bool
	// stateDirs are the directories the deployment keeps writable across
	// restarts of the process (a volume, a StateDirectory=): --state-file
	// must live in one.
	stateDirs map[string]bool
	// notDeployed: the daemon's defaults, not a deployment's command line;
	// it need not keep state.
	notDeployed bool
}

// consulEnv is every variable the Consul API client reads, as the consul CLI does.
var consulEnv = map[string]bool{
	consulapi.HTTPAddrEnvName: true, consulapi.HTTPTokenEnvName: true, consulapi.HTTPTokenFileEnvName: true,
	consulapi.HTTPAuthEnvName: true, consulapi.HTTPSSLEnvName: true, consulapi.HTTPCAFile: true,
	consulapi.HTTPCAPath: true, consulapi.HTTPClientCert: true, consulapi.HTTPClientKey: true,
	consulapi.HTTPTLSServerName: true, consulapi.HTTPSSLVerifyEnvName: true,
	consulapi.HTTPNamespaceEnvName: true, consulapi.HTTPPartitionEnvName: true,
}

// runtimeEnv is read by the Go runtime, not by sharelimit.
var runtimeEnv = map[string]bool{"GOMEMLIMIT": true, "GOMAXPROCS": true, "GODEBUG": true, "GOGC": true}

// flagEnv is every SHARELIMIT_* variable that maps to a serve flag.
func flagEnv() map[string]string {
	names := map[string]string{}
	config.Defaults().FlagSet("serve").VisitAll(func(f *flag.Flag) { names[config.EnvName(f.Name)] = f.Name })
	return names
}

// checkDaemon parses d's arguments and environment exactly as `sharelimit
// serve` does and validates the result, with each mounted container path
// replaced by the repository directory behind it. It returns the settings as
// the daemon would see them, or nil when they do not parse.
func checkDaemon(p *problems, d daemon) *config.Config {
	args := d.args
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		if args[0] != "serve" {
			p.addf("%s: runs %q, not serve", d.where, args[0])
			return nil
		}
		args = args[1:]
	}
	known := flagEnv()
	for name := range d.env {
		switch {
		case strings.HasPrefix(name, config.EnvPrefix):
			if _, ok := known[name]; !ok {
				p.addf("%s: %s is not the variable of any serve flag", d.where, name)
			}
		case consulEnv[name], runtimeEnv[name], d.helperEnv[name]:
		default:
			p.addf("%s: environment variable %s means nothing to sharelimit", d.where, name)
		}
	}
	var usage bytes.Buffer
	cfg, err := config.Parse("serve", args, func(k string) string { return d.env[k] }, &usage)
	if err != nil {
		p.addf("%s: sharelimit serve %s: %v", d.where, strings.Join(args, " "), err)
		return nil
	}
	// Validate looks at the files, so it gets the repository's copy of each.
	local := *cfg
	if dir, ok := d.mounts[cfg.ConfigDir]; ok {
		local.ConfigDir = dir
	} else {
		p.addf("%s: --config-dir %s: nothing is mounted there", d.where, cfg.ConfigDir)
	}
	for _, f := range []*string{&local.GRPCTLSCert, &local.GRPCTLSKey, &local.GRPCTLSClientCA} {
		if m, ok := d.mounts[*f]; ok && *f != "" {
			*f = m
		}
	}
	if err := local.Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			p.addf("%s: %s", d.where, line)
		}
	}
	// Every example keeps its buckets across restarts: a restart, a deploy
	// or a crash must hand out no fresh burst.
	switch {
	case d.notDeployed:
	case cfg.StateFile == "":
		p.addf("%s: no --state-file: every restart would hand out a fresh burst", d.where)
	case !d.stateDirs[path.Dir(cfg.StateFile)]:
		p.addf("%s: --state-file %s: %s is not a directory the deployment keeps, writable, across restarts", d.where, cfg.StateFile, path.Dir(cfg.StateFile))
	}
	if cfg.ConsulService != "" {
		addr := d.env[consulapi.HTTPAddrEnvName]
		if addr == "" {
			p.addf("%s: --consul-service is set but %s is not: the daemon would look for an agent on 127.0.0.1:8500 by default", d.where, consulapi.HTTPAddrEnvName)
		} else if _, _, err := net.SplitHostPort(strings.TrimPrefix(strings.TrimPrefix(addr, "http://"), "https://")); err != nil {
			p.addf("%s: %s=%q: want host:port", d.where, consulapi.HTTPAddrEnvName, addr)
		}
	}
	return cfg
}

// stopBudget is the longest a graceful stop can take: the drain, then the
// in-flight deadline.
func stopBudget(cfg *config.Config) time.Duration { return cfg.Drain + cfg.ShutdownTimeout }

// runCache shares the answers of the binary between checks that ask the same
// question of the same files: the breakage cases repeat most of the real
// checks, and on a small machine hundreds of process starts add up.
var runCache sync.Map // key -> *cachedRun

type cachedRun struct {
	once sync.Once
	out  string
	err  error
}

// sharelimit runs the built binary with args, one of which is dir (a
// descriptor directory or file). The answer is keyed by the other arguments and
// dir's contents, so a copy of the same files elsewhere gets the same answer,
// with its own path in it.
func sharelimit(dir string, args ...string) (string, error) {
	const placeholder = "\x00DIR\x00"
	h := sha256.New()
	for _, a := range args {
		if a == dir {
			a = placeholder
		}
		fmt.Fprintf(h, "%q ", a)
	}
	files := []string{dir}
	if fi, err := os.Stat(dir); err == nil && fi.IsDir() {
		entries, _ := os.ReadDir(dir)
		files = files[:0]
		for _, e := range entries {
			files = append(files, filepath.Join(dir, e.Name()))
		}
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		fmt.Fprintf(h, "\n%s %v %d:", filepath.Base(f), err != nil, len(b))
		h.Write(b)
	}
	v, _ := runCache.LoadOrStore(string(h.Sum(nil)), &cachedRun{})
	c := v.(*cachedRun)
	c.once.Do(func() {
		bin, err := testutil.Binary(command)
		if err != nil {
			c.err = err
			return
		}
		out, err := exec.Command(bin, args...).CombinedOutput()
		c.out, c.err = strings.ReplaceAll(string(out), dir, placeholder), err
	})
	out := strings.ReplaceAll(c.out, placeholder, dir)
	if c.err != nil {
		return out, fmt.Errorf("sharelimit %s: %v\n%s", strings.Join(args, " "), c.err, out)
	}
	return out, nil
}

// checkDescriptors runs `sharelimit check` on a directory.
func checkDescriptors(p *problems, where, dir string) {
	if _, err := sharelimit(dir, "check", dir); err != nil {
		p.addf("%s: %v", where, err)
	}
}

// compiledRules is `sharelimit check -v` without source positions: two
// directories with the same rules print the same, whatever their comments.
func compiledRules(dir string) (string, error) {
	out, err := sharelimit(dir, "check", "-v", dir)
	if err != nil {
		return "", err
	}
	return regexp.MustCompile(` @\d+:\d+`).ReplaceAllString(out, ""), nil
}

// explain runs `sharelimit explain` for one descriptor and reports whether a
// rule limits it (an unlimited rule counts: it is a rule that matched).
func explain(dir, domain string, replicas int, entries []string) (limited bool, out string, err error) {
	args := append([]string{"explain", "--config-dir", dir, "--domain", domain, "--replicas", fmt.Sprint(max(replicas, 1))}, entries...)
	out, err = sharelimit(dir, args...)
	if err != nil {
		return false, out, err
	}
	return strings.Contains(out, "is limited by"), out, nil
}

// isLoopbackAddr reports whether a listen address (host:port or unix:path) is
// reachable only from this host or network namespace.
func isLoopbackAddr(addr string) bool {
	if strings.HasPrefix(addr, "unix:") {
		return true
	}
	host, _, err := net.SplitHostPort(addr)
	return err == nil && config.IsLoopback(host)
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
