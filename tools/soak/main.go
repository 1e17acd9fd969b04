// Command soak runs a small sharelimit cluster under mixed load for a bounded
// time, with config reloads and membership changes, and checks that each
// daemon's goroutine count and heap stay flat and that no request fails. It is
// `make soak`, not part of CI: it takes minutes by design.
//
// Why a command of its own: a leak shows only over minutes of real load on
// real processes (the built binary, a Consul agent of its own, and package
// loadgen's load), longer than any test should run. It must never run
// unbounded (-duration is at most 1h, and an interrupt ends it early), and
// never leave a process it started running or its work directory behind.
//
//	go run ./tools/soak -duration 10m
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/sharelimit/sharelimit/loadgen"
)

func main() {
	duration := flag.Duration("duration", 10*time.Minute, "how long to soak (at most 1h)")
	daemons := flag.Int("daemons", 3, "sharelimit processes")
	rate := flag.Float64("rate", 3000, "total offered requests per second")
	flag.Parse()
	if *duration <= 0 || *duration > time.Hour || *daemons < 2 {
		fmt.Fprintln(os.Stderr, "soak: -duration in (0, 1h], -daemons >= 2")
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := soak(ctx, *duration, *daemons, *rate); err != nil {
		fmt.Fprintln(os.Stderr, "soak: FAIL:", err)
		os.Exit(1)
	}
	fmt.Println("soak: PASS")
}

type proc struct {
	cmd  *exec.Cmd
	http string
	grpc string
	node string
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

func rules(limit int) string {
	return fmt.Sprintf(`domain: bench
descriptors:
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: %d}
  - key: generic_key
    rate_limit: {unit: minute, requests_per_unit: 100000}
`, limit)
}

// soak runs n daemons under load at rate for duration, changing their
// config and membership as it goes, and judges them at the end.
func soak(ctx context.Context, duration time.Duration, n int, rate float64) error {
	cl, err := newCluster()
	if err != nil {
		return err
	}
	defer cl.close()
	if err := cl.startConsul(ctx); err != nil {
		return err
	}
	if err := cl.startDaemons(ctx, n); err != nil {
		return err
	}
	// The load ends by itself after duration; an interrupt ends it early.
	loadCtx, cancelLoad := context.WithCancel(ctx)
	defer cancelLoad()
	results := startLoad(loadCtx, cl.targets(), rate, duration)
	samples, err := cl.watch(ctx, duration)
	if err != nil {
		return err
	}
	var failures []string
	for range 2 {
		r := <-results
		if r.err != nil {
			return r.err
		}
		fmt.Printf("load %s: %d requests, %d ok, %d over limit, %d errors, p99 %v\n", r.r.Shape, r.r.Requests, r.r.OK, r.r.OverLimit, r.r.Errors, r.r.Latency.P99)
		if r.r.Errors > 0 {
			failures = append(failures, fmt.Sprintf("%d request errors (%v)", r.r.Errors, r.r.ErrorsByCode))
		}
	}
	failures = append(failures, cl.judge(samples)...)
	if len(failures) > 0 {
		return fmt.Errorf("%s", strings.Join(failures, "; "))
	}
	return nil
}

// cluster is the soak's daemons, their Consul agent, and the directory they
// work in.
type cluster struct {
	work, bin, cfgDir, cfgFile string
	consulBin, consul          string // the agent's binary and HTTP address
	agent                      *exec.Cmd
	procs                      []*proc
}

// newCluster builds the binary into a new work directory and writes the
// first rules.
func newCluster() (*cluster, error) {
	work, err := os.MkdirTemp("", "sharelimit-soak")
	if err != nil {
		return nil, err
	}
	cl := &cluster{work: work, bin: filepath.Join(work, "sharelimit"), cfgDir: filepath.Join(work, "config")}
	cl.cfgFile = filepath.Join(cl.cfgDir, "bench.yaml")
	if out, err := exec.Command("go", "build", "-o", cl.bin, "./cmd/sharelimit").CombinedOutput(); err != nil {
		cl.close()
		return nil, fmt.Errorf("build: %v\n%s", err, out)
	}
	consulBin, err := exec.Command("tools/consul/install.sh").Output()
	if err != nil {
		cl.close()
		return nil, fmt.Errorf("consul: %v", err)
	}
	cl.consulBin = strings.TrimSpace(string(consulBin))
	os.Mkdir(cl.cfgDir, 0o755)
	// 3 a minute per IP: at a third of it per daemon a bucket refills in about
	// a minute, while each of the 200k IPs comes back every couple of minutes,
	// so the live buckets settle at a working set instead of growing or being
	// swept away: the heap has something to hold, and should stay flat.
	if err := os.WriteFile(cl.cfgFile, []byte(rules(3)), 0o644); err != nil {
		cl.close()
		return nil, err
	}
	return cl, nil
}

// close stops every process started and removes the work directory.
func (cl *cluster) close() {
	for _, p := range cl.procs {
		p.cmd.Process.Kill()
		p.cmd.Wait()
	}
	if cl.agent != nil {
		cl.agent.Process.Kill()
		cl.agent.Wait()
	}
	os.RemoveAll(cl.work)
}

// startConsul starts a Consul agent of our own, on free ports, and waits
// for its leader.
func (cl *cluster) startConsul(ctx context.Context) error {
	httpPort, serfPort, serverPort := freePort(), freePort(), freePort()
	agent := exec.Command(cl.consulBin, "agent", "-dev", "-bind", "127.0.0.1", "-client", "127.0.0.1",
		"-node", "soak-agent", "-http-port", httpPort, "-serf-lan-port", serfPort, "-server-port", serverPort,
		"-serf-wan-port", "-1", "-dns-port", "-1", "-grpc-port", "-1", "-grpc-tls-port", "-1", "-log-level", "warn",
		"-data-dir", filepath.Join(cl.work, "consul"))
	if err := agent.Start(); err != nil {
		return err
	}
	cl.agent = agent
	cl.consul = "127.0.0.1:" + httpPort
	if err := waitFor(ctx, 30*time.Second, func() bool {
		b, err := httpGet("http://" + cl.consul + "/v1/status/leader")
		return err == nil && strings.Trim(strings.TrimSpace(b), `"`) != ""
	}); err != nil {
		return fmt.Errorf("consul never elected a leader: %w", err)
	}
	return nil
}

// register registers node as a passing instance of the service "app", or
// deregisters it.
func (cl *cluster) register(node string, on bool) error {
	var body, method, url string
	if on {
		method, url = http.MethodPut, "http://"+cl.consul+"/v1/catalog/register"
		body = fmt.Sprintf(`{"Node":%q,"Address":"127.0.0.1","Service":{"ID":"app-%s","Service":"app"},"Check":{"CheckID":"service:app-%s","Name":"app","Status":"passing","ServiceID":"app-%s"}}`, node, node, node, node)
	} else {
		method, url = http.MethodPut, "http://"+cl.consul+"/v1/catalog/deregister"
		body = fmt.Sprintf(`{"Node":%q}`, node)
	}
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s %s: %s", method, url, resp.Status)
	}
	return nil
}

// startDaemons registers and starts n daemons, and waits until each is
// healthy.
func (cl *cluster) startDaemons(ctx context.Context, n int) error {
	for i := 1; i <= n; i++ {
		p := &proc{http: "127.0.0.1:" + freePort(), grpc: "127.0.0.1:" + freePort(), node: fmt.Sprintf("soak-%d", i)}
		if err := cl.register(p.node, true); err != nil {
			return err
		}
		p.cmd = exec.Command(cl.bin, "serve", "--config-dir", cl.cfgDir, "--grpc-addr", p.grpc, "--http-addr", p.http,
			"--consul-service", "app", "--node", p.node, "--consul-query-rate", "10", "--sweep-interval", "2s",
			"--reload-debounce", "100ms", "--drain", "0", "--log-level", "warn")
		p.cmd.Env = append(os.Environ(), "CONSUL_HTTP_ADDR="+cl.consul)
		p.cmd.Stderr = os.Stderr
		if err := p.cmd.Start(); err != nil {
			return err
		}
		cl.procs = append(cl.procs, p)
	}
	for _, p := range cl.procs {
		if err := waitFor(ctx, 30*time.Second, func() bool { _, err := httpGet("http://" + p.http + "/healthcheck"); return err == nil }); err != nil {
			return fmt.Errorf("%s never healthy", p.node)
		}
	}
	return nil
}

func (cl *cluster) targets() []string {
	var out []string
	for _, p := range cl.procs {
		out = append(out, p.grpc)
	}
	return out
}

// loadResult is what one load generator measured.
type loadResult struct {
	r   loadgen.Result
	err error
}

// startLoad offers rate to targets for duration, half on per-IP keys and
// half on one generic key; each half reports on the channel when done.
func startLoad(ctx context.Context, targets []string, rate float64, duration time.Duration) <-chan loadResult {
	results := make(chan loadResult, 2)
	for _, shape := range []loadgen.Shape{loadgen.ShapeRemoteAddress, loadgen.ShapeGenericKey} {
		go func() {
			r, err := loadgen.Run(ctx, loadgen.Config{Targets: targets, Conns: 2, Rate: rate / 2, Duration: duration,
				Shape: shape, Cardinality: 200_000, Domain: "bench", Timeout: 2 * time.Second})
			results <- loadResult{r, err}
		}()
	}
	return results
}

// sample is one scrape's figures of a daemon.
type sample struct{ goroutines, heap float64 }

// samples are each daemon's figures after warm-up, at the end, and at their
// peak, by node.
type samples struct{ first, last, peak map[string]sample }

// watch scrapes every daemon every 10 s for duration, reloading the config
// every 20 s and taking the last daemon out of the service, or back in,
// every 30 s.
//
// The heap is judged by the collector's goal, which it sets from the live
// heap at the end of each cycle: heap in use swings by the GOGC factor
// between cycles and says little about a leak.
func (cl *cluster) watch(ctx context.Context, duration time.Duration) (samples, error) {
	fmt.Printf("%-8s %-8s %12s %12s %10s %8s\n", "elapsed", "daemon", "goroutines", "heap_goal", "buckets", "weight")
	ss := samples{first: map[string]sample{}, peak: map[string]sample{}, last: map[string]sample{}}
	start := time.Now()
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	step := 0
	for time.Since(start) < duration {
		select {
		case <-ctx.Done():
			return ss, ctx.Err()
		case <-tick.C:
		}
		step++
		if step%2 == 0 {
			os.WriteFile(cl.cfgFile, []byte(rules(3+step%2)), 0o644)
		}
		if step%3 == 0 {
			cl.register(cl.procs[len(cl.procs)-1].node, (step/3)%2 == 0)
		}
		for _, p := range cl.procs {
			m, err := scrape(p.http)
			if err != nil {
				return ss, fmt.Errorf("%s: %v", p.node, err)
			}
			s := sample{m["go_goroutines"], m["go_memstats_next_gc_bytes"]}
			fmt.Printf("%-8s %-8s %12.0f %12.0f %10.0f %8.3g\n", time.Since(start).Round(time.Second), p.node, s.goroutines, s.heap, m["sharelimit_buckets"], m["sharelimit_membership_weight"])
			// The first third warms up: buckets fill to their working set.
			if time.Since(start) < max(time.Minute, duration/3) || ss.first[p.node] == (sample{}) {
				ss.first[p.node] = s
			}
			ss.last[p.node] = s
			pk := ss.peak[p.node]
			ss.peak[p.node] = sample{max(pk.goroutines, s.goroutines), max(pk.heap, s.heap)}
		}
	}
	return ss, nil
}

// judge prints each daemon's figures and returns what failed: goroutines
// or heap that grew after warm-up, or a daemon that exited.
func (cl *cluster) judge(ss samples) []string {
	var failures []string
	for _, p := range cl.procs {
		f, l, pk := ss.first[p.node], ss.last[p.node], ss.peak[p.node]
		fmt.Printf("%s: goroutines %.0f -> %.0f (peak %.0f); heap goal %.1f -> %.1f MiB (peak %.1f)\n",
			p.node, f.goroutines, l.goroutines, pk.goroutines, f.heap/(1<<20), l.heap/(1<<20), pk.heap/(1<<20))
		if l.goroutines > f.goroutines+10 {
			failures = append(failures, fmt.Sprintf("%s: goroutines grew %.0f -> %.0f", p.node, f.goroutines, l.goroutines))
		}
		if l.heap > 1.5*f.heap+16<<20 {
			failures = append(failures, fmt.Sprintf("%s: heap grew %.1f -> %.1f MiB", p.node, f.heap/(1<<20), l.heap/(1<<20)))
		}
		if p.cmd.ProcessState != nil {
			failures = append(failures, p.node+" exited")
		}
	}
	return failures
}

func httpGet(url string) (string, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	if resp.StatusCode != 200 {
		return b.String(), fmt.Errorf("%s: %s", url, resp.Status)
	}
	return b.String(), nil
}

// scrape reads the unlabelled samples of /metrics.
func scrape(addr string) (map[string]float64, error) {
	body, err := httpGet("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || strings.Contains(line, "{") {
			continue
		}
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		if f, err := strconv.ParseFloat(val, 64); err == nil {
			out[name] = f
		}
	}
	return out, nil
}

func waitFor(ctx context.Context, limit time.Duration, cond func() bool) error {
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s", limit)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}
