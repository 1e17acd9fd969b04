// Package consultest runs real Consul agents for tests.
//
// sharelimit's membership is only as good as its reading of Consul's health
// catalog, and a hand-written fake would encode our assumptions about Consul
// rather than Consul's behaviour. So the tests that matter run a real agent:
// one dev-mode agent per test, on free loopback ports, in a temporary data
// directory, killed when the test ends. One agent models many nodes: instances
// on other node names are registered through the catalog as external nodes.
//
// The agent binary comes from $SHARELIMIT_CONSUL_BIN or, when that is unset,
// from tools/consul/install.sh, which builds and caches it. A missing binary
// fails the test: it never skips, so CI always exercises a real Consul.
package consultest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

// BinaryEnv names the environment variable that points at a Consul binary,
// bypassing tools/consul/install.sh.
const BinaryEnv = "SHARELIMIT_CONSUL_BIN"

const (
	modulePath   = "github.com/sharelimit/sharelimit"
	installer    = "tools/consul/install.sh"
	readyTimeout = 30 * time.Second
	startTries   = 3
)

// Option changes how Start runs an agent.
type Option func(*options)

type options struct {
	node string
	args []string
}

// WithNode names the agent's own node; the default is unique per agent.
func WithNode(name string) Option { return func(o *options) { o.node = name } }

// WithArgs appends arguments to the agent's command line, for example
// "-hcl", `acl { enabled = true }`.
func WithArgs(args ...string) Option {
	return func(o *options) { o.args = append(o.args, args...) }
}

// Agent is a running dev-mode Consul agent owned by one test. Its helpers
// report failures with Fatalf on the testing.TB given to Start, so call them
// from that test's goroutine; give each test its own agent rather than sharing
// one across parallel subtests. Addr and NodeName are safe for concurrent use.
type Agent struct {
	t      testing.TB
	bin    string
	base   string // holds one data directory per agent process
	node   string
	args   []string
	ports  [3]int // http, serf LAN, server RPC
	client *api.Client

	mu   sync.Mutex
	proc *process // nil while stopped
}

type process struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited
	err  error         // cmd.Wait's result, set before done closes
}

var agentSeq atomic.Uint64

// Start runs a fresh agent and waits until it has a leader. The agent is
// killed, and waited for, when the test ends.
func Start(t testing.TB, opts ...Option) *Agent {
	t.Helper()
	o := options{node: fmt.Sprintf("consultest-%d-%d", os.Getpid(), agentSeq.Add(1))}
	for _, opt := range opts {
		opt(&o)
	}
	began := time.Now()
	bin, err := Binary()
	if err != nil {
		t.Fatalf("consultest: a real Consul agent is required and none could be had: %v", err)
	}
	a := &Agent{t: t, bin: bin, base: t.TempDir(), node: o.node, args: o.args}
	// Registered after TempDir, so it runs first: the agent dies before its
	// data directory is removed.
	t.Cleanup(a.cleanup)

	var errs []error
	for range startTries {
		a.ports, err = freePorts()
		if err == nil {
			err = a.start()
		}
		if err == nil {
			break
		}
		errs = append(errs, err) // most likely a port taken in the meantime
	}
	if err != nil {
		t.Fatalf("consultest: start consul agent: %v", errors.Join(errs...))
	}
	t.Logf("consultest: consul agent %s ready at %s after %s", a.node, a.Addr(), time.Since(began).Round(time.Millisecond))

	cfg := &api.Config{
		Address: a.Addr(),
		Scheme:  "http",
		// No pooled connections: they would outlive agent restarts and show
		// up as leaked goroutines in packages that use goleak.
		HttpClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
	}
	a.client, err = api.NewClient(cfg)
	if err != nil {
		t.Fatalf("consultest: consul client for %s: %v", a.Addr(), err)
	}
	return a
}

// Addr is the agent's HTTP address as host:port, the form CONSUL_HTTP_ADDR
// takes. It stays the same across Stop and Restart.
func (a *Agent) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(a.ports[0])) }

// NodeName is the agent's own node name, as /v1/agent/self reports it.
func (a *Agent) NodeName() string { return a.node }

// Client is a client for test setup, talking to this agent without a token.
func (a *Agent) Client() *api.Client { return a.client }

// Stop kills the agent, as a crash would, and waits for it to exit. Stopping a
// stopped agent does nothing.
func (a *Agent) Stop() {
	a.t.Helper()
	a.mu.Lock()
	p := a.proc
	a.proc = nil
	a.mu.Unlock()
	if p == nil {
		return
	}
	select {
	case <-p.done:
		a.t.Errorf("consultest: consul agent %s had exited by itself (%v); its log:\n%s", a.node, p.err, tail(p.log))
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	<-p.done
}

// Restart kills the agent if it runs and starts a fresh one with the same node
// name on the same ports, so clients pointed at Addr reach it again. The new
// agent is empty: its catalog holds none of the old registrations.
func (a *Agent) Restart() {
	a.t.Helper()
	a.Stop()
	// The ports were just released by our own agent; retry briefly in case the
	// kernel has not let go of them yet.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := a.start()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			a.t.Fatalf("consultest: restart consul agent on %s: %v", a.Addr(), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func (a *Agent) cleanup() {
	failed := a.t.Failed()
	a.mu.Lock()
	p := a.proc
	a.mu.Unlock()
	a.Stop()
	if failed && p != nil {
		a.t.Logf("consultest: log of consul agent %s:\n%s", a.node, tail(p.log))
	}
}

// start runs one agent process on a.ports and waits until it is ready.
func (a *Agent) start() error {
	dir, err := os.MkdirTemp(a.base, "agent-")
	if err != nil {
		return err
	}
	logPath := filepath.Join(dir, "agent.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close() // the child has its own descriptor

	args := []string{
		"agent", "-dev",
		"-bind", "127.0.0.1", "-client", "127.0.0.1",
		"-node", a.node,
		"-data-dir", filepath.Join(dir, "data"),
		"-http-port", strconv.Itoa(a.ports[0]),
		"-serf-lan-port", strconv.Itoa(a.ports[1]),
		"-server-port", strconv.Itoa(a.ports[2]),
		// Unused listeners are disabled; without -grpc-tls-port -1 the agent
		// silently takes 8503 and parallel agents collide.
		"-serf-wan-port", "-1", "-dns-port", "-1",
		"-grpc-port", "-1", "-grpc-tls-port", "-1",
		"-log-level", "warn",
	}
	cmd := exec.Command(a.bin, append(args, a.args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = agentEnv()
	configureProcess(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", a.bin, err)
	}
	p := &process{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := a.waitReady(p); err != nil {
		_ = cmd.Process.Kill()
		<-p.done
		return err
	}
	a.mu.Lock()
	a.proc = p
	a.mu.Unlock()
	return nil
}

// waitReady polls until the agent on a.ports is ours and knows a leader.
func (a *Agent) waitReady(p *process) error {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	base := "http://" + a.Addr()
	deadline := time.Now().Add(readyTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("consul agent exited during start-up (%v); its log:\n%s", p.err, tail(p.log))
		case <-time.After(25 * time.Millisecond):
		}
		var self struct{ Config struct{ NodeName string } }
		if last = getJSON(hc, base+"/v1/agent/self", &self); last != nil {
			continue
		}
		if self.Config.NodeName != a.node {
			// Another process answers on our port.
			return fmt.Errorf("port %d answers as node %q, not %q", a.ports[0], self.Config.NodeName, a.node)
		}
		var leader string
		if last = getJSON(hc, base+"/v1/status/leader", &leader); last != nil {
			continue
		}
		if leader != "" {
			return nil
		}
		last = errors.New("no leader yet")
	}
	return fmt.Errorf("consul agent not ready within %s (last: %v); its log:\n%s", readyTimeout, last, tail(p.log))
}

func getJSON(hc *http.Client, url string, out any) error {
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
	}
	return json.Unmarshal(body, out)
}

// RegisterInstance registers service instance serviceID of serviceName on
// node, with one check whose status is passing or critical. An instance on the
// agent's own node goes through the agent API with a TTL check (the agent's
// anti-entropy would delete a catalog-only registration there); any other node
// is an external node registered in the catalog.
func (a *Agent) RegisterInstance(node, serviceID, serviceName string, passing bool) {
	a.t.Helper()
	var err error
	if node == a.node {
		err = a.client.Agent().ServiceRegister(&api.AgentServiceRegistration{
			ID:   serviceID,
			Name: serviceName,
			Check: &api.AgentServiceCheck{
				CheckID: checkID(serviceID),
				TTL:     "24h",
				Status:  status(passing),
			},
		})
	} else {
		_, err = a.client.Catalog().Register(&api.CatalogRegistration{
			Node:    node,
			Address: "127.0.0.1",
			Service: &api.AgentService{ID: serviceID, Service: serviceName},
			Check:   catalogCheck(node, serviceID, passing),
		}, nil)
	}
	if err != nil {
		a.t.Fatalf("consultest: register %s/%s: %v", node, serviceID, err)
	}
}

// SetCheck sets the status of the check RegisterInstance gave serviceID.
func (a *Agent) SetCheck(node, serviceID string, passing bool) {
	a.t.Helper()
	var err error
	if node == a.node {
		err = a.client.Agent().UpdateTTL(checkID(serviceID), "", status(passing))
	} else {
		_, err = a.client.Catalog().Register(&api.CatalogRegistration{
			Node:    node,
			Address: "127.0.0.1",
			Check:   catalogCheck(node, serviceID, passing),
		}, nil)
	}
	if err != nil {
		a.t.Fatalf("consultest: set check of %s/%s: %v", node, serviceID, err)
	}
}

// Deregister removes serviceID and its check from node.
func (a *Agent) Deregister(node, serviceID string) {
	a.t.Helper()
	var err error
	if node == a.node {
		err = a.client.Agent().ServiceDeregister(serviceID)
	} else {
		_, err = a.client.Catalog().Deregister(&api.CatalogDeregistration{Node: node, ServiceID: serviceID}, nil)
	}
	if err != nil {
		a.t.Fatalf("consultest: deregister %s/%s: %v", node, serviceID, err)
	}
}

// catalogCheck is the service check of an instance on an external node.
func catalogCheck(node, serviceID string, passing bool) *api.AgentCheck {
	return &api.AgentCheck{
		Node:      node,
		CheckID:   checkID(serviceID),
		Name:      "consultest " + serviceID,
		Status:    status(passing),
		ServiceID: serviceID,
	}
}

func checkID(serviceID string) string { return "service:" + serviceID }

func status(passing bool) string {
	if passing {
		return api.HealthPassing
	}
	return api.HealthCritical
}

// Binary returns the path of the Consul agent binary: $SHARELIMIT_CONSUL_BIN
// if set, else whatever tools/consul/install.sh prints (building it on the
// first run, which takes minutes on a cold machine). The answer is computed
// once per process.
func Binary() (string, error) { return binary() }

var binary = sync.OnceValues(func() (string, error) { return findBinary(os.Getenv(BinaryEnv)) })

// findBinary is Binary's work, given the value of $SHARELIMIT_CONSUL_BIN.
func findBinary(fromEnv string) (string, error) {
	if p := fromEnv; p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s: %w", BinaryEnv, err)
		}
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, installer)
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("bash", script)
	cmd.Stdout = &stdout
	// A cold build takes minutes; let its progress show.
	cmd.Stderr = io.MultiWriter(&stderr, os.Stderr)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build consul with %s (or set $%s): %w\n%s", script, BinaryEnv, err, lastBytes(stderr.String(), 4096))
	}
	lines := strings.Fields(stdout.String())
	if len(lines) == 0 {
		return "", fmt.Errorf("%s printed no binary path", script)
	}
	path := lines[len(lines)-1]
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s printed %q: %w", script, path, err)
	}
	return path, nil
}

// moduleRoot walks up from the working directory to the directory whose
// go.mod declares sharelimit's main module (tools/consul has a go.mod of its
// own, which is skipped).
func moduleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; {
		if f, err := os.Open(filepath.Join(dir, "go.mod")); err == nil {
			name := moduleName(f)
			f.Close()
			if name == modulePath {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod declaring module %s above %s", modulePath, wd)
		}
		dir = parent
	}
}

func moduleName(r io.Reader) string {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`+"`")
		}
	}
	return ""
}

// freePorts finds three loopback ports free for both TCP and UDP (serf uses
// both), none handed out before by this process. Another process can still
// take one before the agent binds it; Start retries then.
func freePorts() ([3]int, error) {
	var ports [3]int
	var held []io.Closer
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < len(ports); {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return ports, err
		}
		held = append(held, l)
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		held = append(held, u)
		if !claimPort(port) {
			continue
		}
		ports[i] = port
		i++
	}
	return ports, nil
}

var claimed = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

func claimPort(port int) bool {
	claimed.Lock()
	defer claimed.Unlock()
	if claimed.ports[port] {
		return false
	}
	claimed.ports[port] = true
	return true
}

// agentEnv is the test's environment without CONSUL_* variables, so a
// developer's own Consul settings never reach the test agent.
func agentEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CONSUL_") {
			env = append(env, kv)
		}
	}
	return env
}

// tail returns the end of the log at path.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return lastBytes(string(b), 8192)
}

func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
