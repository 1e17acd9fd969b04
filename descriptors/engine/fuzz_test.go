package engine

import (
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// FuzzDecide decodes arbitrary bytes as a request's descriptors and decides
// them against the fixtures: no panic, a status per descriptor, never UNKNOWN.
func FuzzDecide(f *testing.F) {
	set, err := compileFiles(f, "../testdata/valid")
	if err != nil {
		f.Fatal(err)
	}
	seed := []*commonv3.RateLimitDescriptor{
		desc("remote_address=1.2.3.4"), desc("message_type=marketing", "to_number=123"),
		desc("path=/api/x/admin/y"), {Entries: entries("k=v"), Limit: &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 1}},
	}
	for _, d := range seed {
		b, _ := proto.Marshal(d)
		f.Add("edge_proxy_per_ip", b, uint32(1), int64(0))
		f.Add("messaging", b, uint32(0), int64(1e9))
	}
	e := newEngine(f, set, bucket.NewStore(1000), Options{Weight: 0.25})
	f.Fuzz(func(t *testing.T, domain string, raw []byte, hits uint32, now int64) {
		var d commonv3.RateLimitDescriptor
		if proto.Unmarshal(raw, &d) != nil {
			return
		}
		descs := []*commonv3.RateLimitDescriptor{&d, &d}
		out, code, err := decide(e, domain, descs, hits, now, nil)
		if err != nil {
			return
		}
		if len(out) != 2 || (code != OK && code != OverLimit) {
			t.Fatalf("%d statuses, code %v", len(out), code)
		}
		for _, st := range out {
			if st.Code != OK && st.Code != OverLimit {
				t.Fatalf("status code %v", st.Code)
			}
		}
	})
}
