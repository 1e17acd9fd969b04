package xds

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/protobuf/types/known/anypb"

	"github.com/sharelimit/sharelimit/descriptors"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/internal/xdstest"
)

const testNode = "node-a"

// testBackoff is short, so reconnects and paused NACKs take milliseconds.
var testBackoff = Backoff{Initial: 20 * time.Millisecond, Max: 200 * time.Millisecond}

// rig is a Source running against a real go-control-plane management server
// on a real listener, installing into a real engine.
type rig struct {
	t       *testing.T
	srv     *xdstest.Server
	addr    string
	src     *Source
	engine  *engine.Engine
	applied atomic.Int64
	refuse  atomic.Value // string: Apply refuses a set holding this domain
	logs    testutil.Buffer
	done    chan error
}

func newRig(t *testing.T, adjust ...func(*Config)) *rig {
	t.Helper()
	srv, err := xdstest.Start("127.0.0.1:0", testNode)
	if err != nil {
		t.Fatal(err)
	}
	e, err := engine.New(nil, bucket.NewStore(0), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, srv: srv, addr: srv.Addr(), engine: e}
	r.refuse.Store("")
	t.Cleanup(func() { r.srv.Stop() })
	cfg := Config{ServerURL: r.addr, NodeID: testNode, Backoff: testBackoff, Apply: r.apply,
		Log: slog.New(slog.NewTextHandler(&r.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))}
	for _, f := range adjust {
		f(&cfg)
	}
	if r.src, err = New(cfg); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *rig) apply(set *descriptors.Set) error {
	if d := r.refuse.Load().(string); d != "" && set.Domain(d) != nil {
		return fmt.Errorf("domain %s is not allowed here", d)
	}
	r.engine.Swap(set)
	r.applied.Add(1)
	return nil
}

// run starts Run; the test's cleanup stops it and checks that it returned nil.
func (r *rig) run() {
	ctx, cancel := context.WithCancel(context.Background())
	r.done = make(chan error, 1)
	go func() { r.done <- r.src.Run(ctx) }()
	r.t.Cleanup(func() {
		cancel()
		if err := testutil.Within(r.t, r.done, "Run to return"); err != nil {
			r.t.Error(err)
		}
	})
}

// waitFor polls cond, reporting the source's status, the server's requests
// and the logs if it never holds.
func (r *rig) waitFor(what string, cond func() bool) {
	r.t.Helper()
	testutil.Eventually(r.t, 30*time.Second, func() error {
		if cond() {
			return nil
		}
		return fmt.Errorf("waiting for %s\nstatus %+v\nrequests %+v\nlogs:\n%s", what, r.src.Status(), r.srv.Requests(), r.logs.String())
	})
}

// acked reports whether the server has seen version ACKed.
func (r *rig) acked(version string) bool {
	for _, q := range r.srv.Requests() {
		if q.Version == version && q.Nonce != "" && !q.Nack() {
			return true
		}
	}
	return false
}

// limitOf is the requests_per_unit of domain's only rule in force, or -1.
func (r *rig) limitOf(domain string) int64 {
	d := r.engine.Set().Domain(domain)
	if d == nil || len(d.Rules()) == 0 {
		return -1
	}
	return int64(d.Rules()[0].Limit().RequestsPerUnit())
}

func domainConfig(domain string, rpu uint32) *rlc {
	return &rlc{Name: domain, Domain: domain, Descriptors: []*desc{{Key: "k", RateLimit: limit(second, rpu)}}}
}

func (r *rig) set(version string, configs ...*rlc) {
	r.t.Helper()
	if err := r.srv.Set(version, configs...); err != nil {
		r.t.Fatal(err)
	}
}

// TestInitialPush: the first snapshot is installed and ACKed, First closes,
// and the node id, its metadata and the extra headers reach the server.
func TestInitialPush(t *testing.T) {
	t.Parallel()
	r := newRig(t, func(c *Config) {
		c.NodeMetadata = map[string]string{"zone": "eu-1"}
		c.Headers = map[string]string{"X-Token": "secret"}
	})
	r.set("v1", domainConfig("a", 10))
	r.run()
	testutil.Within(t, r.src.First(), "the first update")
	if got := r.limitOf("a"); got != 10 {
		t.Fatalf("limit %d in force, want 10", got)
	}
	r.waitFor("the ACK of v1", func() bool { return r.acked("v1") })
	st := r.src.Status()
	if !st.Connected || st.ConnectedSince.IsZero() || st.Version != "v1" || st.Updates != 1 || st.Nacks != 0 || st.LastChange.IsZero() || st.Server != r.addr {
		t.Fatalf("status %+v", st)
	}
	first := r.srv.Requests()[0]
	if first.Node != testNode || first.NodeMetadata["zone"] != "eu-1" || first.Version != "" || first.Nonce != "" {
		t.Fatalf("first request %+v", first)
	}
	for _, md := range r.srv.Headers() {
		if got := md.Get("x-token"); len(got) != 1 || got[0] != "secret" {
			t.Fatalf("stream headers %v", md)
		}
	}
}

// TestUpdate: a new version replaces the rules, and is ACKed.
func TestUpdate(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.set("v1", domainConfig("a", 10))
	r.run()
	testutil.Within(t, r.src.First(), "the first update")
	r.set("v2", domainConfig("a", 20), domainConfig("b", 5))
	r.waitFor("v2 in force", func() bool { return r.limitOf("a") == 20 && r.limitOf("b") == 5 })
	r.waitFor("the ACK of v2", func() bool { return r.acked("v2") })
	if st := r.src.Status(); st.Version != "v2" || st.Updates != 2 || st.Nacks != 0 {
		t.Fatalf("status %+v", st)
	}
}

// TestBadUpdateNacked: an update that does not compile is NACKed with the
// compile error, naming the version last accepted; the rules in force stay
// and Apply is not called. The server's snapshot cache sends the refused
// update again after every NACK; the NACKs that answer it are paced by the
// back-off, and a good update still gets through.
func TestBadUpdateNacked(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.set("v1", domainConfig("a", 10))
	r.run()
	testutil.Within(t, r.src.First(), "the first update")
	inForce := r.engine.Set()

	bad := domainConfig("a", 20)
	bad.Descriptors[0].RateLimit.Unit = unknownUnit
	r.set("v2", bad)
	r.waitFor("a NACK", func() bool { return len(r.srv.Nacks()) > 0 })
	n := r.srv.Nacks()[0]
	const want = "xds:a:5:15: descriptors[0].rate_limit.unit: invalid rate limit unit 'UNKNOWN'"
	if n.Version != "v1" || n.Error != want {
		t.Fatalf("NACK %+v, want version v1 and error %q", n, want)
	}
	st := r.src.Status()
	if st.Version != "v1" || st.Nacks != 1 || st.LastNack.Version != "v2" || st.LastNack.Error != want || st.LastNack.At.IsZero() {
		t.Fatalf("status %+v", st)
	}

	// The cache resends v2 after each NACK. Wait for a few rounds: each NACK
	// must come at least the back-off's pause after the one before.
	const rounds = 5
	r.waitFor("repeated NACKs", func() bool { return len(r.srv.Nacks()) >= rounds })
	nacks := r.srv.Nacks()
	var least time.Duration
	for k := range rounds - 1 {
		least += time.Duration(float64(min(testBackoff.Initial<<k, testBackoff.Max)) * (1 - DefaultBackoffJitter))
	}
	if gap := nacks[rounds-1].At.Sub(nacks[0].At); gap < least {
		t.Fatalf("%d NACKs within %s, want at least %s between the first and the last", rounds, gap, least)
	}
	if r.engine.Set() != inForce || r.applied.Load() != 1 || r.src.Status().Nacks != 1 {
		t.Fatalf("rules changed (%d applies) or the same update counted again: %+v", r.applied.Load(), r.src.Status())
	}

	r.set("v3", domainConfig("a", 30))
	r.waitFor("v3 in force", func() bool { return r.limitOf("a") == 30 })
	r.waitFor("the ACK of v3", func() bool { return r.acked("v3") })
	if st := r.src.Status(); st.Version != "v3" || st.Updates != 2 || st.Nacks != 1 || st.LastNack.Version != "v2" {
		t.Fatalf("status %+v", st)
	}
}

// TestApplyRefusal: a set that compiles but that Apply refuses is NACKed
// with Apply's error, and the rules in force stay.
func TestApplyRefusal(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.refuse.Store("forbidden")
	r.set("v1", domainConfig("a", 10))
	r.run()
	testutil.Within(t, r.src.First(), "the first update")
	inForce := r.engine.Set()
	r.set("v2", domainConfig("a", 20), domainConfig("forbidden", 1))
	r.waitFor("a NACK", func() bool { return len(r.srv.Nacks()) > 0 })
	if n := r.srv.Nacks()[0]; n.Version != "v1" || n.Error != "apply: domain forbidden is not allowed here" {
		t.Fatalf("NACK %+v", n)
	}
	if r.engine.Set() != inForce || r.applied.Load() != 1 {
		t.Fatal("rules changed")
	}
	if st := r.src.Status(); st.Version != "v1" || st.LastNack.Version != "v2" {
		t.Fatalf("status %+v", st)
	}
}

// TestEmptyUpdate: an update with no resources is a valid set with no rules.
func TestEmptyUpdate(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.set("v1", domainConfig("a", 10))
	r.run()
	testutil.Within(t, r.src.First(), "the first update")
	r.set("v2")
	r.waitFor("no rules in force", func() bool { return len(r.engine.Set().Domains()) == 0 })
	r.waitFor("the ACK of v2", func() bool { return r.acked("v2") })
	if st := r.src.Status(); st.Version != "v2" || st.Updates != 2 {
		t.Fatalf("status %+v", st)
	}
}

// TestForeignResourceNacked: resources of another type (here go-control-plane
// wraps each in a discovery Resource, as it does for a TTL) are refused.
func TestForeignResourceNacked(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	if err := r.srv.SetWithTTL("v1", time.Hour, domainConfig("a", 10)); err != nil {
		t.Fatal(err)
	}
	r.run()
	r.waitFor("a NACK", func() bool { return len(r.srv.Nacks()) > 0 })
	if n := r.srv.Nacks()[0]; n.Version != "" || !strings.Contains(n.Error, `resource of type "type.googleapis.com/envoy.service.discovery.v3.Resource"`) {
		t.Fatalf("NACK %+v", n)
	}
	select {
	case <-r.src.First():
		t.Fatal("First closed without a set installed")
	default:
	}
	if r.applied.Load() != 0 || r.src.Status().Nacks != 1 {
		t.Fatalf("%d applies, status %+v", r.applied.Load(), r.src.Status())
	}
}

// TestServerRestart: when the server goes away the rules in force stand and
// the status says so; when it comes back on the same address, the source
// reconnects, tells it the version it has, and installs the server's new one.
func TestServerRestart(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.set("v1", domainConfig("a", 10))
	r.run()
	testutil.Within(t, r.src.First(), "the first update")
	r.waitFor("the ACK of v1", func() bool { return r.acked("v1") })
	inForce := r.engine.Set()

	r.srv.Stop()
	r.waitFor("disconnected", func() bool { st := r.src.Status(); return !st.Connected && st.LastError != "" })
	firstErr := r.src.Status().LastErrorAt
	r.waitFor("a failed reconnect", func() bool { return r.src.Status().LastErrorAt.After(firstErr) })
	if r.engine.Set() != inForce || r.applied.Load() != 1 || r.src.Status().Version != "v1" {
		t.Fatalf("rules changed while the server was down: status %+v", r.src.Status())
	}

	srv := restart(t, r.addr)
	r.srv = srv
	r.set("v2", domainConfig("a", 20))
	r.waitFor("v2 in force", func() bool { return r.limitOf("a") == 20 })
	r.waitFor("the ACK of v2", func() bool { return r.acked("v2") })
	if first := srv.Requests()[0]; first.Version != "v1" || first.Nonce != "" {
		t.Fatalf("first request to the new server %+v, want version v1", first)
	}
	if st := r.src.Status(); !st.Connected || st.Version != "v2" || st.Updates != 2 {
		t.Fatalf("status %+v", st)
	}
}

// TestServerLate: a source started before its server waits, disconnected,
// and installs the first snapshot once the server is up.
func TestServerLate(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.srv.Stop()
	r.run()
	r.waitFor("a failed connection", func() bool { st := r.src.Status(); return !st.Connected && st.LastError != "" })
	srv := restart(t, r.addr)
	r.srv = srv
	r.set("v1", domainConfig("a", 10))
	testutil.Within(t, r.src.First(), "the first update")
	if r.limitOf("a") != 10 {
		t.Fatal("v1 not in force")
	}
}

// restart starts a server on addr again, retrying while the port is busy.
func restart(t *testing.T, addr string) *xdstest.Server {
	t.Helper()
	var srv *xdstest.Server
	testutil.Eventually(t, 30*time.Second, func() (err error) {
		srv, err = xdstest.Start(addr, testNode)
		return err
	})
	t.Cleanup(srv.Stop)
	return srv
}

// TestRunTwice: a Source runs once.
func TestRunTwice(t *testing.T) {
	t.Parallel()
	r := newRig(t)
	r.run()
	// Only once the first Run holds the source is a second one refused;
	// before that, the second would be the one that runs.
	r.waitFor("the first Run connected", func() bool { return r.src.Status().Connected })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := r.src.Run(ctx); !errors.Is(err, ErrRunning) {
		t.Fatalf("second Run: %v", err)
	}
}

// TestForeignResponseNacked: a response of another type than the one
// subscribed to is NACKed in its own terms (its type, no version).
func TestForeignResponseNacked(t *testing.T) {
	src, err := New(Config{ServerURL: "127.0.0.1:1", Apply: func(*descriptors.Set) error { t.Fatal("Apply called"); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	res, err := anypb.New(domainConfig("a", 1))
	if err != nil {
		t.Fatal(err)
	}
	const foreign = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
	req := src.handle(context.Background(), &session{acked: "v0"},
		&discoveryv3.DiscoveryResponse{TypeUrl: foreign, VersionInfo: "v1", Nonce: "n1", Resources: []*anypb.Any{res}})
	if req.GetTypeUrl() != foreign || req.GetVersionInfo() != "" || req.GetResponseNonce() != "n1" ||
		!strings.Contains(req.GetErrorDetail().GetMessage(), `response of type "`+foreign+`"`) {
		t.Fatalf("answer %v", req)
	}
}
