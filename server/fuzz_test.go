package server

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/internal/monotime"
	"github.com/sharelimit/sharelimit/source"
)

func directService(t testing.TB) *Service { return directServiceFrom(t, "testdata/rules.yaml") }

func directServiceFrom(t testing.TB, rules string) *Service {
	set, err := source.Load(rules)
	if err != nil {
		t.Fatal(err)
	}
	store := bucket.NewStore(10_000)
	e := newEngine(t, set, store, engine.Options{Weight: 0.5})
	m := NewMetrics(store)
	m.Bind(set)
	return NewService(e, monotime.New(), m, Options{ResponseHeaders: true, HeaderLimit: "a", HeaderRemaining: "b", HeaderReset: "c"},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
}

var seedRequests = []*rlsv3.RateLimitRequest{
	{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{d("fixed=one")}},
	{Domain: "test", HitsAddend: 3, Descriptors: []*commonv3.RateLimitDescriptor{d("ip=1.2.3.4"), d("free=x"), d("general=a"), d("special=b")}},
	{Domain: "test", Descriptors: []*commonv3.RateLimitDescriptor{d("shadow=s", "deeper=1")}},
	{Domain: "", Descriptors: []*commonv3.RateLimitDescriptor{d("=")}},
}

// FuzzShouldRateLimit decodes arbitrary bytes as a RateLimitRequest and calls
// the handler: every answer is a response with a status per descriptor and a
// known overall code, or InvalidArgument. Never a panic, never Internal.
func FuzzShouldRateLimit(f *testing.F) {
	for _, r := range seedRequests {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	svc := directService(f)
	f.Fuzz(func(t *testing.T, raw []byte) {
		var req rlsv3.RateLimitRequest
		if proto.Unmarshal(raw, &req) != nil {
			return
		}
		resp, err := svc.ShouldRateLimit(context.Background(), &req)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("unexpected error %v", err)
			}
			return
		}
		if len(resp.Statuses) != len(req.Descriptors) {
			t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
		}
		if resp.OverallCode != rlsv3.RateLimitResponse_OK && resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
			t.Fatalf("overall %v", resp.OverallCode)
		}
		if _, err := proto.Marshal(resp); err != nil {
			t.Fatalf("response does not marshal: %v", err)
		}
	})
}

// FuzzJSON posts arbitrary bodies to /json: 200, 400 or 429, never 500.
func FuzzJSON(f *testing.F) {
	f.Add(`{"domain":"test","descriptors":[{"entries":[{"key":"fixed","value":"one"}]}]}`)
	f.Add(`{"domain":"test","hitsAddend":2,"descriptors":[{"entries":[{"key":"ip","value":"1"}],"limit":{"requestsPerUnit":1,"unit":"SECOND"}}]}`)
	f.Add(`{"domain":"test","descriptors":[{"entries":[{"key":"fixed","value":"one"}],"limit":{"requestsPerUnit":1,"unit":"UNKNOWN"}}]}`)
	f.Add(`{`)
	svc := directService(f)
	a := NewAdmin(svc, svc.engine, svc.metrics, func() []View { return []View{{}} }, func() ReloadStatus { return ReloadStatus{} })
	h := a.Handler()
	f.Fuzz(func(t *testing.T, body string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/json", strings.NewReader(body)))
		switch rec.Code {
		case 200, 400, 429:
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
		}
	})
}
