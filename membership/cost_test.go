package membership

// TestWatchCost measures what watching a large service costs the agent, with
// and without the agent cache. It is a measurement, not a check: it runs only
// when asked,
//
//	SHARELIMIT_CONSUL_BIN=... go test ./membership/ -v -count=1 -run TestWatchCost -cost
//
// and fails only if the watches stop working, never on a figure.

import (
	"bufio"
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/sharelimit/sharelimit/internal/consultest"
)

var costFlag = flag.Bool("cost", false, "run TestWatchCost, which measures the agent's cost of many watches with and without its cache")

const (
	costInstances = 1000
	costWatchers  = 20
	costChanges   = 10
)

// agentCost is what the agent did for the watches over a stretch of time.
type agentCost struct {
	queries      int   // health queries the agent answered over HTTP
	bytes        int64 // their response bodies, as sent
	hits, misses int   // X-Cache headers among them
	serverRPCs   int   // RPCs the agent made to the servers (consul.client.rpc)
	serverReads  int   // health queries the servers ran for the service (consul.health.service.query)
}

func (c agentCost) minus(o agentCost) agentCost {
	return agentCost{c.queries - o.queries, c.bytes - o.bytes, c.hits - o.hits, c.misses - o.misses,
		c.serverRPCs - o.serverRPCs, c.serverReads - o.serverReads}
}

func TestWatchCost(t *testing.T) {
	if !*costFlag {
		t.Skip("a measurement; run it with -run TestWatchCost -cost")
	}
	agents := []struct {
		name string
		args []string
	}{
		{"streaming backend (default)", nil},
		{"use_streaming_backend = false", []string{"-hcl", "use_streaming_backend = false"}},
	}
	type row struct {
		agent, mode   string
		start, change agentCost
		encoding      string
	}
	var rows []row
	for _, ag := range agents {
		for _, cached := range []bool{false, true} {
			mode := "plain blocking"
			if cached {
				mode = "?cached"
			}
			t.Run(ag.name+"/"+mode, func(t *testing.T) {
				start, change, enc := measureWatchCost(t, ag.args, cached)
				rows = append(rows, row{ag.name, mode, start, change, enc})
			})
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n%d instances, %d watches through one agent (consul 1.14.8 -dev), %d catalog changes; default pacing\n\n", costInstances, costWatchers, costChanges)
	fmt.Fprintf(&b, "| agent | query | phase | HTTP queries | bytes sent | X-Cache hit/miss | agent→server RPCs | server health reads |\n")
	fmt.Fprintf(&b, "|---|---|---|---:|---:|---:|---:|---:|\n")
	for _, r := range rows {
		for _, ph := range []struct {
			name string
			c    agentCost
		}{{"start-up", r.start}, {fmt.Sprintf("%d changes", costChanges), r.change}} {
			fmt.Fprintf(&b, "| %s | %s | %s | %d | %s | %d/%d | %d | %d |\n", r.agent, r.mode, ph.name,
				ph.c.queries, mib(ph.c.bytes), ph.c.hits, ph.c.misses, ph.c.serverRPCs, ph.c.serverReads)
		}
	}
	if len(rows) > 0 {
		fmt.Fprintf(&b, "\nbodies sent with Content-Encoding %q (the Go client asks for gzip); -dev agents indent their JSON\n", rows[0].encoding)
	}
	t.Log(b.String())
}

func mib(n int64) string { return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20)) }

// measureWatchCost runs one fresh agent with costInstances instances, starts
// costWatchers watches through a counting proxy, then makes costChanges
// changes, each seen by every watch before the next. It returns the cost of
// the start-up (every watch's first answer) and of the changes.
func measureWatchCost(t *testing.T, args []string, cached bool) (start, change agentCost, encoding string) {
	args = append([]string{"-hcl", `telemetry { prometheus_retention_time = "1h" disable_hostname = true }`}, args...)
	a := consultest.Start(t, consultest.WithArgs(args...))
	registerMany(t, a, costInstances)
	p := newAgentProxy(t, a.Addr())

	snapshot := func() agentCost {
		c := agentCost{}
		for _, s := range p.served() {
			c.queries++
			c.bytes += s.bytes
			switch s.xCache {
			case "HIT":
				c.hits++
			case "MISS":
				c.misses++
			}
			encoding = s.encoding
		}
		c.serverRPCs, c.serverReads = agentCounters(t, a.Addr())
		return c
	}
	// One query first, straight to the agent: the agent's Prometheus sink
	// loses counts when a labelled counter is created by many increments at
	// once, so the health read counter must exist before the watches start.
	if _, _, err := a.Client().Health().Service("web", "", true, nil); err != nil {
		t.Fatal(err)
	}
	before := snapshot()
	watches := make([]*Consul, costWatchers)
	for i := range watches {
		watches[i] = watch(t, ConsulConfig{Service: "web", Node: "node-0", Stale: true, NoCache: !cached}, newClient(t, p.addr(), ""))
	}
	for _, c := range watches {
		waitView(t, c, counts(costInstances, 1), "every watch's first answer")
	}
	// Let the answers' bodies close, so the proxy has counted them.
	time.Sleep(200 * time.Millisecond)
	synced := snapshot()
	for k := range costChanges {
		id := costInstances + k
		registerInstance(t, a.Client(), fmt.Sprintf("node-%d", id), fmt.Sprintf("web-%d", id))
		for _, c := range watches {
			waitView(t, c, counts(costInstances+k+1, 1), "change %d", k)
		}
	}
	time.Sleep(200 * time.Millisecond)
	done := snapshot()
	for _, c := range watches {
		if v := c.View(); v.Errors != 0 {
			t.Errorf("a watch counted %d errors (%s)", v.Errors, v.LastError)
		}
	}
	return synced.minus(before), done.minus(synced), encoding
}

// registerMany registers n passing instances of web, one per external node,
// through the agent's catalog API, a few at a time.
func registerMany(t *testing.T, a *consultest.Agent, n int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, n)
	next := make(chan int)
	for range 8 {
		wg.Go(func() {
			for i := range next {
				if err := catalogRegister(a.Client(), fmt.Sprintf("node-%d", i), fmt.Sprintf("web-%d", i)); err != nil {
					errs <- err
				}
			}
		})
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func registerInstance(t *testing.T, c *api.Client, node, id string) {
	t.Helper()
	if err := catalogRegister(c, node, id); err != nil {
		t.Fatal(err)
	}
}

func catalogRegister(c *api.Client, node, id string) error {
	_, err := c.Catalog().Register(&api.CatalogRegistration{
		Node: node, Address: "127.0.0.1",
		Service: &api.AgentService{ID: id, Service: "web"},
		Check: &api.AgentCheck{Node: node, CheckID: "service:" + id, Name: "cost " + id,
			Status: api.HealthPassing, ServiceID: id},
	}, nil)
	if err != nil {
		return fmt.Errorf("register %s/%s: %w", node, id, err)
	}
	return nil
}

// agentCounters reads two counters from the agent's Prometheus metrics: the
// RPCs it made to the servers, and the health queries the servers ran for
// web.
func agentCounters(t *testing.T, addr string) (rpcs, reads int) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := hc.Get("http://" + addr + "/v1/agent/metrics?format=prometheus")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	value := func(line, name string) (int, bool) {
		rest, ok := strings.CutPrefix(line, name+" ")
		if !ok {
			return 0, false
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		return int(f), err == nil
	}
	for sc.Scan() {
		if v, ok := value(sc.Text(), "consul_client_rpc"); ok {
			rpcs = v
		}
		if v, ok := value(sc.Text(), `consul_health_service_query{service="web"}`); ok {
			reads = v
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rpcs, reads
}
