package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/consultest"
	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/membership"
)

// syncBuf is a log sink the test reads while the daemon writes to it.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) { s.mu.Lock(); defer s.mu.Unlock(); return s.b.Write(p) }
func (s *syncBuf) String() string              { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestDNSOneVIPIsUnshared: in upstream's deployment, --peers-dns naming a
// name that resolves to one address that is not this replica's (a
// Kubernetes ClusterIP Service such as upstream's own "ratelimit" Service,
// a swarm service VIP, a load balancer) counts 1: every replica takes
// weight 1 and enforces every limit whole. That is the unshared fault,
// shown as it is for a static --replicas 1, with a WARN naming the likely
// mistake.
func TestDNSOneVIPIsUnshared(t *testing.T) {
	a := consultest.Start(t, consultest.WithDNS())
	// The name answers one address: a ClusterIP, not any replica's.
	a.RegisterAt("node-1", "ratelimit-svc", "ratelimit", "10.96.0.10", true)

	cfg := testConfig(t)
	cfg.UpstreamBy = []string{"REDIS_URL", "RUNTIME_ROOT"} // upstream's deployment
	cfg.PeersDNS, cfg.PeersDNSServer, cfg.PeersDNSInterval = "ratelimit.service.consul.", a.DNSAddr(), 100*time.Millisecond
	cfg.Replicas = 3 // even a correct --replicas guess is replaced by the count of 1
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	var logs syncBuf
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})), "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, nil) }()
	defer func() { cancel(); <-done }()

	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return !d.views[0].cur.Load().ObservedAt.IsZero() }, "the first answer"))
	v := d.views[0].cur.Load()
	w := d.engine.GroupWeight(d.views[0].group).W
	t.Logf("upstream mode, --peers-dns answering one VIP: total=%d weight=%v fault=%q; WARN lines:\n%s", v.Total, w, v.Fault, logs.String())
	if v.Fault != membership.FaultUnshared {
		t.Errorf("one address, not this host's, in upstream's deployment: fault %q, weight %v; want fault %q", v.Fault, w, membership.FaultUnshared)
	}
	for _, want := range []string{"ClusterIP", "headless", "every limit whole"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("no WARN saying %q", want)
		}
	}
}
