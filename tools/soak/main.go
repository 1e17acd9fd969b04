// Command soak runs a small sharelimit cluster under mixed load for a bounded
// time, with config reloads and membership changes, and checks that each
// daemon's goroutine count and heap stay flat and that no request fails. It is
// `make soak`, not part of CI: it takes minutes by design.
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

func soak(ctx context.Context, duration time.Duration, n int, rate float64) error {
	work, err := os.MkdirTemp("", "sharelimit-soak")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	bin := filepath.Join(work, "sharelimit")
	if out, err := exec.Command("go", "build", "-o", bin, "./cmd/sharelimit").CombinedOutput(); err != nil {
		return fmt.Errorf("build: %v\n%s", err, out)
	}
	consulBin, err := exec.Command("tools/consul/install.sh").Output()
	if err != nil {
		return fmt.Errorf("consul: %v", err)
	}
	cfgDir := filepath.Join(work, "config")
	os.Mkdir(cfgDir, 0o755)
	cfgFile := filepath.Join(cfgDir, "bench.yaml")
	// 3 a minute per IP: at a third of it per daemon a bucket refills in about
	// a minute, while each of the 200k IPs comes back every couple of minutes,
	// so the live buckets settle at a working set instead of growing or being
	// swept away: the heap has something to hold, and should stay flat.
	if err := os.WriteFile(cfgFile, []byte(rules(3)), 0o644); err != nil {
		return err
	}

	// A Consul agent of our own, on free ports.
	httpPort, serfPort, serverPort := freePort(), freePort(), freePort()
	agent := exec.Command(strings.TrimSpace(string(consulBin)), "agent", "-dev", "-bind", "127.0.0.1", "-client", "127.0.0.1",
		"-node", "soak-agent", "-http-port", httpPort, "-serf-lan-port", serfPort, "-server-port", serverPort,
		"-serf-wan-port", "-1", "-dns-port", "-1", "-grpc-port", "-1", "-grpc-tls-port", "-1", "-log-level", "warn",
		"-data-dir", filepath.Join(work, "consul"))
	if err := agent.Start(); err != nil {
		return err
	}
	defer func() { agent.Process.Kill(); agent.Wait() }()
	consul := "127.0.0.1:" + httpPort
	if err := waitFor(ctx, 30*time.Second, func() bool {
		b, err := httpGet("http://" + consul + "/v1/status/leader")
		return err == nil && strings.Trim(strings.TrimSpace(b), `"`) != ""
	}); err != nil {
		return fmt.Errorf("consul never elected a leader: %w", err)
	}
	register := func(node string, on bool) error {
		var body, method, url string
		if on {
			method, url = http.MethodPut, "http://"+consul+"/v1/catalog/register"
			body = fmt.Sprintf(`{"Node":%q,"Address":"127.0.0.1","Service":{"ID":"app-%s","Service":"app"},"Check":{"CheckID":"service:app-%s","Name":"app","Status":"passing","ServiceID":"app-%s"}}`, node, node, node, node)
		} else {
			method, url = http.MethodPut, "http://"+consul+"/v1/catalog/deregister"
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

	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.cmd.Process.Kill()
			p.cmd.Wait()
		}
	}()
	var targets []string
	for i := 1; i <= n; i++ {
		p := &proc{http: "127.0.0.1:" + freePort(), grpc: "127.0.0.1:" + freePort(), node: fmt.Sprintf("soak-%d", i)}
		if err := register(p.node, true); err != nil {
			return err
		}
		p.cmd = exec.Command(bin, "serve", "--config-dir", cfgDir, "--grpc-addr", p.grpc, "--http-addr", p.http,
			"--consul-service", "app", "--node", p.node, "--consul-query-rate", "10", "--sweep-interval", "2s",
			"--reload-debounce", "100ms", "--drain", "0", "--log-level", "warn")
		p.cmd.Env = append(os.Environ(), "CONSUL_HTTP_ADDR="+consul)
		p.cmd.Stderr = os.Stderr
		if err := p.cmd.Start(); err != nil {
			return err
		}
		procs = append(procs, p)
		targets = append(targets, p.grpc)
	}
	for _, p := range procs {
		if err := waitFor(ctx, 30*time.Second, func() bool { _, err := httpGet("http://" + p.http + "/healthcheck"); return err == nil }); err != nil {
			return fmt.Errorf("%s never healthy", p.node)
		}
	}

	// The load ends by itself after duration; an interrupt ends it early.
	loadCtx, cancelLoad := context.WithCancel(ctx)
	defer cancelLoad()
	type loadResult struct {
		r   loadgen.Result
		err error
	}
	results := make(chan loadResult, 2)
	for _, shape := range []loadgen.Shape{loadgen.ShapeRemoteAddress, loadgen.ShapeGenericKey} {
		go func() {
			r, err := loadgen.Run(loadCtx, loadgen.Config{Targets: targets, Conns: 2, Rate: rate / 2, Duration: duration,
				Shape: shape, Cardinality: 200_000, Domain: "bench", Timeout: 2 * time.Second})
			results <- loadResult{r, err}
		}()
	}

	// The heap is judged by the collector's goal, which it sets from the live
	// heap at the end of each cycle: heap in use swings by the GOGC factor
	// between cycles and says little about a leak.
	fmt.Printf("%-8s %-8s %12s %12s %10s %8s\n", "elapsed", "daemon", "goroutines", "heap_goal", "buckets", "weight")
	type sample struct{ goroutines, heap float64 }
	first := map[string]sample{}
	peak := map[string]sample{}
	last := map[string]sample{}
	start := time.Now()
	tick := time.NewTicker(10 * time.Second)
	defer tick.Stop()
	step := 0
	for time.Since(start) < duration {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
		step++
		// Every 20 s a reload; every 30 s the last node leaves or rejoins.
		if step%2 == 0 {
			os.WriteFile(cfgFile, []byte(rules(3+step%2)), 0o644)
		}
		if step%3 == 0 {
			register(procs[n-1].node, (step/3)%2 == 0)
		}
		for _, p := range procs {
			m, err := scrape(p.http)
			if err != nil {
				return fmt.Errorf("%s: %v", p.node, err)
			}
			s := sample{m["go_goroutines"], m["go_memstats_next_gc_bytes"]}
			fmt.Printf("%-8s %-8s %12.0f %12.0f %10.0f %8.3g\n", time.Since(start).Round(time.Second), p.node, s.goroutines, s.heap, m["sharelimit_buckets"], m["sharelimit_membership_weight"])
			// The first third warms up: buckets fill to their working set.
			if time.Since(start) < max(time.Minute, duration/3) || first[p.node] == (sample{}) {
				first[p.node] = s
			}
			last[p.node] = s
			pk := peak[p.node]
			peak[p.node] = sample{max(pk.goroutines, s.goroutines), max(pk.heap, s.heap)}
		}
	}
	var failures []string
	for i := 0; i < 2; i++ {
		r := <-results
		if r.err != nil {
			return r.err
		}
		fmt.Printf("load %s: %d requests, %d ok, %d over limit, %d errors, p99 %v\n", r.r.Shape, r.r.Requests, r.r.OK, r.r.OverLimit, r.r.Errors, r.r.Latency.P99)
		if r.r.Errors > 0 {
			failures = append(failures, fmt.Sprintf("%d request errors (%v)", r.r.Errors, r.r.ErrorsByCode))
		}
	}
	for _, p := range procs {
		f, l, pk := first[p.node], last[p.node], peak[p.node]
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
	if len(failures) > 0 {
		return fmt.Errorf("%s", strings.Join(failures, "; "))
	}
	return nil
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
