package daemon

import (
	"context"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/internal/xdstest"
	"github.com/sharelimit/sharelimit/state"
)

// With xDS and --force-start-without-initial-config the daemon serves before
// its first rules arrive. The saved buckets go in with those rules, before
// any request meets them: a key spent before the restart (2 an hour) stays
// spent, however many buckets the restore has to put back, while clients
// call all along.
func TestXDSForceStartRestoresBeforeServing(t *testing.T) {
	stateFile := filepath.Join(t.TempDir(), "state")
	// A: learn the rule, spend k=1 (2 an hour), stop: the state is written.
	srvA, err := xdstest.Start("127.0.0.1:0", "n")
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	cfg.ConfigType, cfg.XDSServerURL, cfg.XDSNodeID = config.ConfigXDS, srvA.Addr(), "n"
	cfg.XDSBackoffInitial, cfg.XDSBackoffMax = 20*time.Millisecond, 50*time.Millisecond
	cfg.StateFile, cfg.ShutdownTimeout = stateFile, 5*time.Second
	cfg.ForceStart = true
	srvA.Set("v1", xdsConfig("d", 2))
	a, err := New(cfg, quietLog(), "test")
	if err != nil {
		t.Fatal(err)
	}
	ctxA, stopA := context.WithCancel(context.Background())
	doneA := make(chan error, 1)
	go func() { doneA <- a.Run(ctxA, nil) }()
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return a.xds.Status().Version == "v1" }, "A has the rule"))
	for i := 0; i < 3; i++ {
		a.svcCall(t, a.grpcLis.Addr().String())
	}
	stopA()
	<-doneA
	srvA.Stop()

	// Pad the snapshot with 300k more buckets of the same rule before k=1's,
	// as a busy replica's would be, so the restore takes a while.
	s, err := state.ReadFile(stateFile, 1<<30)
	if err != nil || len(s.Buckets) != 1 {
		t.Fatalf("%v, %d buckets", err, len(s.Buckets))
	}
	real := s.Buckets[0]
	if _, _, err := state.WriteFile(stateFile, s.Header, func(add func([]bucket.Saved) error) error {
		pad := make([]bucket.Saved, 300000)
		for i := range pad {
			pad[i] = real
			pad[i].Key = rand.Uint64()
		}
		if err := add(pad); err != nil {
			return err
		}
		return add([]bucket.Saved{real})
	}); err != nil {
		t.Fatal(err)
	}

	// B: force-started, the xDS server has no config yet.
	srvB, err := xdstest.Start("127.0.0.1:0", "n")
	if err != nil {
		t.Fatal(err)
	}
	defer srvB.Stop()
	cfg.XDSServerURL = srvB.Addr()
	r := start(t, cfg)
	var calls, okWithRule, overWithRule atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp := r.call(t, "d", "k=1")
				calls.Add(1)
				switch {
				case resp.Statuses[0].CurrentLimit == nil:
				case resp.OverallCode == rlsv3.RateLimitResponse_OK:
					okWithRule.Add(1)
				default:
					overWithRule.Add(1)
				}
			}
		}()
	}
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return calls.Load() >= 100 }, "calls before the rule"))
	srvB.Set("v1", xdsConfig("d", 2))
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return r.d.engine.Store().Live() >= 300000 }, "restored"))
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return overWithRule.Load() >= 100 }, "calls under the rule"))
	close(stop)
	wg.Wait()
	if n := okWithRule.Load(); n != 0 {
		t.Fatalf("k=1, spent before the restart (2 an hour), was admitted %d times under the rule after the restart", n)
	}
}

// svcCall asks once for d k=1 on the daemon's gRPC address.
func (d *Daemon) svcCall(t *testing.T, addr string) {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "d",
		Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "k", Value: "1"}}}}})
	if err != nil {
		t.Fatal(err)
	}
}
