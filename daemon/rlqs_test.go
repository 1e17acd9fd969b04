package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/membership"
)

// rlqsStream opens an RLQS stream to r's daemon and sends one report for
// bucket id {k: v} of domain d, returning the first answer.
func rlqsExchange(t *testing.T, r *running, v string) (*rlqsv3.RateLimitQuotaResponse, error) {
	t.Helper()
	_, resp, err := rlqsOpen(t, r, v)
	return resp, err
}

// rlqsOpen is rlqsExchange that also returns the stream.
func rlqsOpen(t *testing.T, r *running, v string) (rlqsv3.RateLimitQuotaService_StreamRateLimitQuotasClient, *rlqsv3.RateLimitQuotaResponse, error) {
	t.Helper()
	conn, err := grpc.NewClient(r.d.grpcLis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), rlqsStartHold+20*time.Second)
	t.Cleanup(cancel)
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(conn).StreamRateLimitQuotas(ctx)
	if err != nil {
		t.Fatal(err)
	}
	err = st.Send(&rlqsv3.RateLimitQuotaUsageReports{Domain: "d", BucketQuotaUsages: []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{{
		BucketId: &rlqsv3.BucketId{Bucket: map[string]string{"k": v}}, NumRequestsAllowed: 1}}})
	if errors.Is(err, io.EOF) {
		// The server ended the stream already (Unimplemented, say): its
		// status is what Recv returns, as grpc-go documents for Send.
		_, err = st.Recv()
		return st, nil, err
	}
	if err != nil {
		t.Fatal(err)
	}
	resp, err := st.Recv()
	return st, resp, err
}

// The daemon serves RLQS on its gRPC listener, over either transport: an
// assignment within this replica's share, a lease on the key for RLS, and
// the series once a stream has opened.
func TestDaemonServesRLQS(t *testing.T) {
	for _, transport := range []string{config.TransportGRPCGo, config.TransportDirect} {
		t.Run(transport, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.GRPCTransport, cfg.RLQS = transport, true
			cfg.Replicas, cfg.JoinRamp = 2, 0 // no ramp: new buckets start full
			if err := os.WriteFile(filepath.Join(cfg.ConfigDir, "r.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100}\n"), 0o644); err != nil {
				t.Fatal(err)
			}
			r := start(t, cfg)
			st, resp, err := rlqsOpen(t, r, "x")
			if err != nil {
				t.Fatal(err)
			}
			// A new bucket within rlqsStartHold of the start is denied: the
			// node's Envoys may still enforce a previous process's
			// assignments. Its part follows once the hold is over.
			if b := resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy(); b.GetTokenBucket() != nil || b.GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
				t.Fatalf("a new bucket at the start: %v, want DENY_ALL", resp)
			}
			if resp, err = st.Recv(); err != nil {
				t.Fatal(err)
			}
			tb := resp.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket()
			if tb == nil || tb.GetTokensPerFill().GetValue() == 0 || tb.GetTokensPerFill().GetValue() > 50 {
				t.Fatalf("got %v, want a token bucket within the share of 50/s", resp)
			}
			bs := r.d.engine.BucketShare("d", map[string]string{"k": "x"})
			if bs.Lease == nil || float64(tb.GetTokensPerFill().GetValue())+bs.Lease.Weight()*100 > 50+1e-6 {
				t.Fatalf("lease %v beside %d/s", bs.Lease, tb.GetTokensPerFill().GetValue())
			}
			if code := r.call(t, "d", "k=x").GetOverallCode().String(); code != "OK" {
				t.Fatalf("RLS on the leased key: %s", code)
			}
			// A membership change that shrinks the share is pushed at once.
			r.d.views[0].publish(membership.View{Source: "static", Total: 4, Local: 1, TotalWeight: 4, LocalWeight: 1, Weight: 0.25})
			pushed, err := st.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if n := pushed.GetBucketAction()[0].GetQuotaAssignmentAction().GetRateLimitStrategy().GetTokenBucket().GetTokensPerFill().GetValue(); n == 0 || n > 25 || n >= tb.GetTokensPerFill().GetValue() {
				t.Fatalf("after the share fell to 25/s: %v", pushed)
			}
			addr := r.d.httpLis.Addr().String()
			_, metrics := r.get(t, addr, "/metrics")
			if !strings.Contains(metrics, "sharelimit_rlqs_streams 1") {
				t.Fatal("no sharelimit_rlqs_streams 1 in /metrics")
			}
			for path, want := range map[string]string{"/rlconfig": "rlqs: streams=1 bucket_ids=1", "/rlconfig?format=json": `"assigned_rate_per_second"`, "/": `id="rlqs-buckets"`} {
				if _, page := r.get(t, addr, path); !strings.Contains(page, want) || !strings.Contains(page, "k=x") {
					t.Errorf("%s does not show the stream's bucket (%q):\n%s", path, want, page)
				}
			}
		})
	}
}

// RLQS is off unless --rlqs: the service is not there.
func TestDaemonRLQSOff(t *testing.T) {
	cfg := testConfig(t)
	if cfg.RLQS {
		t.Fatal("--rlqs is on by default")
	}
	r := start(t, cfg)
	if _, err := rlqsExchange(t, r, "x"); status.Code(err) != codes.Unimplemented {
		t.Fatalf("got %v, want Unimplemented", err)
	}
	_, metrics := r.get(t, r.d.httpLis.Addr().String(), "/metrics")
	if strings.Contains(metrics, "sharelimit_rlqs_") {
		t.Fatal("RLQS series with --rlqs=false")
	}
	if _, page := r.get(t, r.d.httpLis.Addr().String(), "/rlconfig"); strings.Contains(page, "rlqs") {
		t.Fatalf("/rlconfig shows RLQS with --rlqs=false:\n%s", page)
	}
}

// With --rlqs a grow of the membership view waits at least --rlqs-ttl: a
// replica that died leaves its Envoys enforcing their last assignments until
// those expire, and the others must not grow into its part before.
func TestMembershipHoldCoversRLQSTTL(t *testing.T) {
	for _, tc := range []struct {
		rlqs      bool
		hold, ttl time.Duration
		want      time.Duration
	}{
		{false, 2 * time.Second, 15 * time.Second, 2 * time.Second},
		{true, 2 * time.Second, 15 * time.Second, 15 * time.Second},
		{true, 0, 15 * time.Second, 15 * time.Second},
		{true, 30 * time.Second, 15 * time.Second, 30 * time.Second},
	} {
		cfg := &config.Config{RLQS: tc.rlqs, MembershipHold: tc.hold, RLQSTTL: tc.ttl}
		if got := membershipHold(cfg); got != tc.want {
			t.Errorf("--rlqs=%v --membership-hold %s --rlqs-ttl %s: hold %s, want %s", tc.rlqs, tc.hold, tc.ttl, got, tc.want)
		}
	}
}

// With the global --shadow-mode, RLQS hands out ALLOW_ALL, as RLS answers
// OK, while the pages still show the part each stream would have had.
func TestDaemonRLQSShadowMode(t *testing.T) {
	cfg := testConfig(t)
	cfg.RLQS, cfg.ShadowMode = true, true
	cfg.Replicas, cfg.JoinRamp = 2, 0
	if err := os.WriteFile(filepath.Join(cfg.ConfigDir, "r.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 100}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := start(t, cfg)
	resp, err := rlqsExchange(t, r, "x")
	if err != nil {
		t.Fatal(err)
	}
	qa := resp.GetBucketAction()[0].GetQuotaAssignmentAction()
	if _, ok := qa.GetRateLimitStrategy().GetStrategy().(*typev3.RateLimitStrategy_BlanketRule_); !ok ||
		qa.GetRateLimitStrategy().GetBlanketRule() != typev3.RateLimitStrategy_ALLOW_ALL || qa.GetAssignmentTimeToLive().GetSeconds() != int64(cfg.RLQSTTL/time.Second) {
		t.Fatalf("got %v, want ALLOW_ALL with the TTL", resp)
	}
	// Once the start hold is over, the pages show the part.
	testutil.Eventually(t, 20*time.Second, func() error {
		snap := r.d.rlqsSnap()
		if snap == nil || len(snap.Buckets) != 1 || !(snap.Buckets[0].AssignedRate > 0) || snap.Buckets[0].AssignedRate > 50+1e-6 {
			return fmt.Errorf("the pages do not show the part the stream would have had: %+v", snap)
		}
		return nil
	})
}
