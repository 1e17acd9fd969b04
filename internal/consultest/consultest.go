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
// AAAAProxy, in front of an agent's DNS interface, adds the one fault a real
// agent cannot produce on demand: AAAA queries mishandled.
//
// Why a package of its own: membership, demand/consulkv, demand/controller,
// daemon and e2e all test against Consul, and each would otherwise start,
// wait for and clean up its agent its own way. Only tests import it:
// production code must never depend on it, and it must never leave an
// agent running or a data directory behind once its test ends.
package consultest

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
)

const startTries = 3

// Option changes how Start runs an agent.
type Option func(*options)

type options struct {
	node string
	args []string
	dns  bool
}

// WithNode names the agent's own node; the default is unique per agent.
func WithNode(name string) Option { return func(o *options) { o.node = name } }

// WithDNS turns on the agent's DNS interface, on a free loopback port that
// DNSAddr names, answering over UDP and TCP.
func WithDNS() Option { return func(o *options) { o.dns = true } }

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
	ports  []int // http, serf LAN, server RPC, and DNS with WithDNS
	client *api.Client

	mu   sync.Mutex
	proc *process // nil while stopped
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
	nports := 3
	if o.dns {
		nports = 4
	}
	// Registered after TempDir, so it runs first: the agent dies before its
	// data directory is removed.
	t.Cleanup(a.cleanup)

	var errs []error
	for range startTries {
		a.ports, err = freePorts(nports)
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

// DNSAddr is the agent's DNS address as host:port; "" without WithDNS. It
// stays the same across Stop and Restart.
func (a *Agent) DNSAddr() string {
	if len(a.ports) < 4 {
		return ""
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(a.ports[3]))
}

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
