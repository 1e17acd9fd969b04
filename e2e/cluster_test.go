package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"text/template"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sharelimit/sharelimit/internal/consultest"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// service is the Consul service whose passing instances are the replicas.
const service = "app"

const (
	// queryRate is --consul-query-rate: fast enough that a catalog change
	// reaches every daemon well within the 2 s the scenarios allow.
	queryRate = "20"
	// dnsInterval is --peers-dns-interval, for the same reason.
	dnsInterval = "250ms"
	// drain is --drain. Long enough to watch a daemon answer while it drains,
	// short enough to keep the suite quick.
	drain = 2 * time.Second
	// startTimeout bounds a daemon's start-up, health included.
	startTimeout = 20 * time.Second
	// pollEvery is how often the admin endpoints are polled while waiting for
	// a view or a reload; it is the resolution of the latencies reported.
	// After pollFastFor the polls slow to pollSlowly: a wait that long is
	// measured in seconds, and polling four daemons a hundred times a second
	// would take CPU from the load being measured.
	pollEvery   = 10 * time.Millisecond
	pollFastFor = time.Second
	pollSlowly  = 100 * time.Millisecond
)

// configParams fills testdata/edge.yaml.tmpl.
type configParams struct {
	Limit int // generic_key=cluster: requests per second, cluster-wide (L)
	Burst int // its burst (B); 0 leaves the default, requests_per_unit
	Quota int // generic_key=quota: requests per hour, cluster-wide
}

// burst is B, the cluster-wide size of the global limit's bucket.
func (p configParams) burst() float64 {
	if p.Burst > 0 {
		return float64(p.Burst)
	}
	return float64(p.Limit)
}

var configTemplate = template.Must(template.ParseFiles("testdata/edge.yaml.tmpl"))

// cluster is K nodes of the service "app", each running a sharelimit daemon
// beside it, and one Consul agent whose catalog lists the nodes' instances
// (as external nodes: one agent models the whole datacenter). Daemon i runs as
// node i+1, with its own loopback ports, on the shared config directory.
//
// A cluster belongs to one test; its helpers must be called from that test's
// goroutine unless they say otherwise.
type cluster struct {
	t       *testing.T
	consul  *consultest.Agent
	dir     string // the config directory every daemon watches
	logs    string // one log file per daemon process
	daemons []*daemon
	procs   []*daemon // every process ever started, for the cleanup
	admin   *http.Client
	// args are added to every daemon's command line from the next start on,
	// and env to its environment.
	args []string
	env  []string
	// state gives every daemon a --state-file of its own, kept across its
	// restarts, from the next start on.
	state    bool
	stateDir string
	// peersDNS, when set, is --peers-dns for every daemon from the next start
	// on, resolved through the agent's DNS (consultest.WithDNS) instead of
	// --consul-service; and each instance registered gets an address of its
	// own, which the agent's DNS answers with.
	peersDNS string
}

// newCluster starts a Consul agent (with opts) and writes the config; no
// daemon runs yet. Every daemon started later is killed, by its PID, when the
// test ends.
func newCluster(t *testing.T, k int, p configParams, opts ...consultest.Option) *cluster {
	t.Helper()
	c := &cluster{
		t:        t,
		consul:   consultest.Start(t, opts...),
		dir:      t.TempDir(),
		stateDir: t.TempDir(),
		logs:     t.TempDir(),
		daemons:  make([]*daemon, k),
		admin:    &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 2}},
	}
	// Registered after the agent's cleanup and the temp dirs', so it runs
	// first: the daemons die before their agent and their directories.
	t.Cleanup(c.cleanup)
	c.writeConfig(p)
	return c
}

func (c *cluster) cleanup() {
	for _, d := range c.procs {
		d.kill()
	}
	c.admin.CloseIdleConnections()
	if c.t.Failed() {
		for _, d := range c.procs {
			c.t.Logf("log of daemon %s (pid %d):\n%s", d.node, d.pid(), tail(d.log, 6000))
		}
	}
}

// writeConfig writes the descriptor file in place, as an operator editing it
// would (the file is truncated and rewritten, not replaced).
func (c *cluster) writeConfig(p configParams) {
	c.t.Helper()
	var b bytes.Buffer
	if err := configTemplate.Execute(&b, p); err != nil {
		c.t.Fatalf("render config: %v", err)
	}
	if err := os.WriteFile(filepath.Join(c.dir, "edge.yaml"), b.Bytes(), 0o644); err != nil {
		c.t.Fatalf("write config: %v", err)
	}
}

// writeFile writes another descriptor file into the config directory.
func (c *cluster) writeFile(name, content string) {
	c.t.Helper()
	if err := os.WriteFile(filepath.Join(c.dir, name), []byte(content), 0o644); err != nil {
		c.t.Fatalf("write %s: %v", name, err)
	}
}

func nodeName(i int) string  { return fmt.Sprintf("node%d", i+1) }
func serviceID(i int) string { return fmt.Sprintf("%s-%d", service, i+1) }

// register adds node i's passing instance of the service to the catalog.
func (c *cluster) register(idx ...int) {
	c.t.Helper()
	for _, i := range idx {
		addr := ""
		if c.peersDNS != "" {
			addr = fmt.Sprintf("192.0.2.%d", i+1)
		}
		c.consul.RegisterAt(nodeName(i), serviceID(i), service, addr, true)
	}
}

// deregister removes node i's instance from the catalog.
func (c *cluster) deregister(idx ...int) {
	c.t.Helper()
	for _, i := range idx {
		c.consul.Deregister(nodeName(i), serviceID(i))
	}
}

// daemon is one sharelimit process and a gRPC connection to it, as the Envoy
// on its node would hold one.
type daemon struct {
	node     string
	grpcAddr string
	httpAddr string
	log      string
	cmd      *exec.Cmd
	done     chan struct{} // closed when the process has exited
	err      error         // cmd.Wait's result, set before done closes
	conn     *grpc.ClientConn
	rls      rlsv3.RateLimitServiceClient
	health   healthpb.HealthClient
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

func (d *daemon) exited() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

// grpcHealth asks the gRPC health service about "ratelimit".
func (d *daemon) grpcHealth() (healthpb.HealthCheckResponse_ServingStatus, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	h, err := d.health.Check(ctx, &healthpb.HealthCheckRequest{Service: "ratelimit"})
	if err != nil {
		return 0, err
	}
	return h.Status, nil
}

// kill ends the process, by its PID, if it still runs, and closes the
// connection. It is safe to call more than once.
func (d *daemon) kill() {
	if !d.exited() {
		_ = d.cmd.Process.Kill()
	}
	<-d.done
	d.conn.Close()
}

// sigterm asks the daemon to shut down gracefully.
func (d *daemon) sigterm(t *testing.T) {
	t.Helper()
	if err := d.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatalf("SIGTERM %s (pid %d): %v", d.node, d.pid(), err)
	}
}

// waitExit waits for the process to exit and returns cmd.Wait's error (nil
// for exit status 0).
func (d *daemon) waitExit(t *testing.T, timeout time.Duration) error {
	t.Helper()
	select {
	case <-d.done:
		return d.err
	case <-time.After(timeout):
		t.Fatalf("daemon %s (pid %d) still running %s after SIGTERM:\n%s", d.node, d.pid(), timeout, tail(d.log, 4000))
		return nil
	}
}

// start runs daemon i on fresh ports and waits until it is healthy.
// replicas is --replicas, the count that stands until Consul first answers.
func (c *cluster) start(i, replicas int) *daemon {
	c.t.Helper()
	sharelimitBin(c.t) // built before the ports are chosen
	var errs []error
	for range 3 {
		d, err := c.launch(i, testutil.FreeAddr(c.t), testutil.FreeAddr(c.t), replicas)
		if err == nil {
			c.daemons[i] = d
			return d
		}
		errs = append(errs, err) // most likely a port taken in the meantime
	}
	c.t.Fatalf("start daemon %s: %v", nodeName(i), errors.Join(errs...))
	return nil
}

// restart runs daemon i again on the ports of its previous process, which
// must have exited: an Envoy bootstrap names a fixed address.
func (c *cluster) restart(i, replicas int) *daemon {
	c.t.Helper()
	old := c.daemons[i]
	if !old.exited() {
		c.t.Fatalf("restart %s: the previous process still runs", old.node)
	}
	d, err := c.launch(i, old.grpcAddr, old.httpAddr, replicas)
	if err != nil {
		c.t.Fatalf("restart daemon %s: %v", nodeName(i), err)
	}
	c.daemons[i] = d
	return d
}

func (c *cluster) launch(i int, grpcAddr, httpAddr string, replicas int) (*daemon, error) {
	node := nodeName(i)
	logf, err := os.CreateTemp(c.logs, node+"-*.log")
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	args := []string{"serve", "--grpc-addr", grpcAddr, "--http-addr", httpAddr, "--config-dir", c.dir}
	if c.peersDNS == "" {
		args = append(args, "--consul-service", service, "--node", node, "--consul-query-rate", queryRate)
	} else {
		args = append(args, "--peers-dns", c.peersDNS, "--peers-dns-server", c.consul.DNSAddr(), "--peers-dns-interval", dnsInterval)
	}
	cmd := exec.Command(sharelimitBin(c.t), append(args,
		"--replicas", strconv.Itoa(replicas),
		"--drain", drain.String(),
		"--shutdown-timeout", "5s",
		"--log-format", "json",
		// The scenarios measure the buckets' arithmetic from a cold start,
		// initial bursts included; the join ramp scenarios turn it on.
		"--join-ramp", "0",
	)...)
	if c.state {
		cmd.Args = append(cmd.Args, "--state-file", filepath.Join(c.stateDir, node+".state"))
	}
	cmd.Args = append(cmd.Args, c.args...)
	cmd.Env = append(append(daemonEnv(), "CONSUL_HTTP_ADDR="+c.consul.Addr()), c.env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	configureProcess(cmd)
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("run %s: %w", sharelimitBin(c.t), err)
	}
	d := &daemon{node: node, grpcAddr: grpcAddr, httpAddr: httpAddr, log: logf.Name(), cmd: cmd, done: make(chan struct{})}
	go func() {
		d.err = cmd.Wait()
		close(d.done)
	}()
	d.conn, err = grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		_ = cmd.Process.Kill()
		<-d.done
		return nil, fmt.Errorf("gRPC client for %s: %w", grpcAddr, err)
	}
	d.rls = rlsv3.NewRateLimitServiceClient(d.conn)
	d.health = healthpb.NewHealthClient(d.conn)
	c.procs = append(c.procs, d)

	// Ready means both health endpoints say so. The gRPC check also opens
	// the connection the load will use, as Envoy holds one open.
	err = testutil.Poll(startTimeout, func() error {
		if d.exited() {
			return nil // said below
		}
		code, err := c.healthcheck(d)
		if err != nil || code != http.StatusOK {
			return fmt.Errorf("/healthcheck: %d %v", code, err)
		}
		if h, err := d.grpcHealth(); err != nil || h != healthpb.HealthCheckResponse_SERVING {
			return fmt.Errorf("gRPC health: %v %v", h, err)
		}
		return nil
	})
	switch {
	case d.exited():
		return nil, fmt.Errorf("%s exited during start-up (%v):\n%s", node, d.err, tail(d.log, 4000))
	case err != nil:
		d.kill()
		return nil, fmt.Errorf("%s not healthy: %w\n%s", node, err, tail(d.log, 4000))
	}
	return d, nil
}

// startAll starts daemons 0..k-1 and waits until each sees k replicas.
func (c *cluster) startAll(k int) {
	c.t.Helper()
	for i := range k {
		c.start(i, k)
	}
	c.awaitViews(time.Now(), startTimeout, view{total: k, weight: 1 / float64(k)}, c.daemons[:k]...)
}

// healthcheck returns the status code of the daemon's /healthcheck.
func (c *cluster) healthcheck(d *daemon) (int, error) {
	resp, err := c.admin.Get("http://" + d.httpAddr + "/healthcheck")
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// rlconfig is the part of /rlconfig?format=json the tests read.
type rlconfig struct {
	Membership struct {
		Source     string    `json:"source"`
		Total      int       `json:"total"`
		Local      int       `json:"local"`
		Weight     float64   `json:"weight"`
		ObservedAt time.Time `json:"observed_at"`
		AgeSeconds float64   `json:"age_seconds"`
		LastError  string    `json:"last_error"`
		Errors     uint64    `json:"errors"`
		Demand     *struct {
			Leading bool   `json:"leading"`
			Leader  string `json:"leader"`
			Rules   []struct {
				Rule    string  `json:"rule"`
				Value   string  `json:"value"`
				Offered float64 `json:"offered_per_second"`
				Share   float64 `json:"share"`
				Equal   float64 `json:"equal_share"`
				Ratio   float64 `json:"cluster_admitted_ratio"`
			} `json:"rules"`
			Division []struct {
				Rule  string  `json:"rule"`
				Value string  `json:"value"`
				Node  string  `json:"node"`
				Share float64 `json:"share"`
			} `json:"division"`
		} `json:"demand"`
	} `json:"membership"`
	Reload struct {
		Generation int    `json:"generation"`
		LastError  string `json:"last_error"`
	} `json:"reload"`
	Rules []struct {
		Rule         string  `json:"rule"`
		ClusterRate  float64 `json:"cluster_rate_per_second"`
		ClusterBurst uint64  `json:"cluster_burst"`
		LocalRate    float64 `json:"local_rate_per_second"`
		LocalBurst   float64 `json:"local_burst"`
	} `json:"rules"`
}

// rule returns the figures of the rule with the given config path.
func (r *rlconfig) rule(path string) (rate, localRate float64, ok bool) {
	for _, x := range r.Rules {
		if x.Rule == path {
			return x.ClusterRate, x.LocalRate, true
		}
	}
	return 0, 0, false
}

func (c *cluster) rlconfig(d *daemon) (*rlconfig, error) {
	resp, err := c.admin.Get("http://" + d.httpAddr + "/rlconfig?format=json")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /rlconfig: %s", resp.Status)
	}
	var r rlconfig
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("decode /rlconfig: %w", err)
	}
	return &r, nil
}

// mustRlconfig is rlconfig for the test's goroutine.
func (c *cluster) mustRlconfig(d *daemon) *rlconfig {
	c.t.Helper()
	r, err := c.rlconfig(d)
	if err != nil {
		c.t.Fatalf("%s: %v", d.node, err)
	}
	return r
}

// metrics scrapes the daemon's /metrics into series → value, where a series
// is written as Prometheus prints it: name{label="value",...}.
func (c *cluster) metrics(d *daemon) map[string]float64 {
	c.t.Helper()
	resp, err := c.admin.Get("http://" + d.httpAddr + "/metrics")
	if err != nil {
		c.t.Fatalf("%s: scrape /metrics: %v", d.node, err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		cut := strings.LastIndexByte(line, ' ')
		if cut < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[cut+1:], 64)
		if err != nil {
			continue
		}
		out[line[:cut]] = v
	}
	if err := sc.Err(); err != nil {
		c.t.Fatalf("%s: read /metrics: %v", d.node, err)
	}
	return out
}

// checkShare fails the test unless d reports the view everywhere an operator
// would look: /rlconfig's membership, the global limit's local share there,
// and the membership gauges in /metrics.
func (c *cluster) checkShare(d *daemon, want view) {
	c.t.Helper()
	r := c.mustRlconfig(d)
	if m := r.Membership; m.Total != want.total || !sameWeight(m.Weight, want.weight) {
		c.t.Errorf("%s: /rlconfig membership total=%d weight=%v, want %v", d.node, m.Total, m.Weight, want)
	}
	rate, local, ok := r.rule(clusterRule)
	if !ok || math.Abs(local-rate*want.weight) > 1e-9 {
		c.t.Errorf("%s: /rlconfig %s local rate %v (found %v), want %v × %v", d.node, clusterRule, local, ok, rate, want.weight)
	}
	m := c.metrics(d)
	if got := m[membershipSeries("total")]; got != float64(want.total) {
		c.t.Errorf("%s: sharelimit_membership_total = %v, want %d", d.node, got, want.total)
	}
	if got := m[membershipSeries("weight")]; !sameWeight(got, want.weight) {
		c.t.Errorf("%s: sharelimit_membership_weight = %v, want %v", d.node, got, want.weight)
	}
}

// view is the membership a daemon should report.
type view struct {
	total  int
	weight float64
}

func (v view) String() string { return fmt.Sprintf("total=%d w=%.4g", v.total, v.weight) }

// viewTrace is how one daemon reached a view: when it was first seen (since
// the moment given to awaitViews), and every other view seen on the way.
type viewTrace struct {
	after time.Duration
	seen  []view
}

// awaitViews polls the daemons' /rlconfig until each reports a view
// confirmed by Consul with want's total and weight, and returns, per daemon,
// how long after since that was first seen (to within pollEvery in the first
// second, pollSlowly after). The other
// views each showed meanwhile are kept, so a transient one is reported.
func (c *cluster) awaitViews(since time.Time, timeout time.Duration, want view, ds ...*daemon) []viewTrace {
	c.t.Helper()
	out := make([]viewTrace, len(ds))
	pending := len(ds)
	reached := make([]bool, len(ds))
	deadline := time.Now().Add(timeout)
	for pending > 0 {
		for i, d := range ds {
			if reached[i] {
				continue
			}
			r, err := c.rlconfig(d)
			at := time.Since(since)
			if err != nil {
				continue
			}
			m := r.Membership
			got := view{total: m.Total, weight: m.Weight}
			if m.Source == "consul" && !m.ObservedAt.IsZero() && m.Total == want.total && sameWeight(m.Weight, want.weight) {
				reached[i] = true
				out[i].after = at
				pending--
				continue
			}
			if n := len(out[i].seen); n == 0 || out[i].seen[n-1] != got {
				out[i].seen = append(out[i].seen, got)
			}
		}
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			var b strings.Builder
			for i, d := range ds {
				fmt.Fprintf(&b, "\n  %s: reached=%v views seen %v", d.node, reached[i], out[i].seen)
			}
			c.t.Fatalf("daemons did not reach %v within %s:%s", want, timeout, b.String())
		}
		time.Sleep(pollInterval(since))
	}
	return out
}

// pollInterval is how long to wait before the next poll of a wait that
// began at since.
func pollInterval(since time.Time) time.Duration {
	if time.Since(since) < pollFastFor {
		return pollEvery
	}
	return pollSlowly
}

func sameWeight(a, b float64) bool { return math.Abs(a-b) < 1e-9 }

// daemonEnv is the test's environment without CONSUL_* and SHARELIMIT_*
// variables, so neither a developer's Consul nor their sharelimit settings
// reach the daemons.
func daemonEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CONSUL_") && !strings.HasPrefix(kv, "SHARELIMIT_") {
			env = append(env, kv)
		}
	}
	return env
}

// tail returns the last n bytes of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	if len(b) > n {
		return "…" + string(b[len(b)-n:])
	}
	return string(b)
}

// membershipSeries names the cluster service's membership series: every
// membership series carries the service it counts.
func membershipSeries(name string) string {
	return `sharelimit_membership_` + name + `{service="` + service + `"}`
}
