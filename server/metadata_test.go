package server

import (
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

const metadataRules = `
domain: md
descriptors:
  - key: a
    metadata: {team: payments, tags: {tier: gold, region: eu}, list: [1, x]}
    rate_limit: {unit: hour, requests_per_unit: 1}
  - key: b
    metadata: {team: search, tags: {tier: silver, owner: ann}, extra: 1}
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: free
    metadata: {never: sent}
    rate_limit: {unlimited: true}
  - key: detailed
    detailed_metric: true
    metadata: {kind: detailed}
    rate_limit: {unit: hour, requests_per_unit: 5}
`

// TestDynamicMetadata: with DynamicMetadata on, each answer carries upstream's
// struct over real gRPC: the domain, every descriptor's entries (with its
// override and hits_addend), the request's hits_addend, and the merged
// metadata of the descriptors that passed (first wins, maps merge, over-limit
// and unlimited descriptors left out).
func TestDynamicMetadata(t *testing.T) {
	f := newFixtureSet(t, Options{DynamicMetadata: true}, 1, parseSet(t, metadataRules))
	call := func(hits uint32, descs ...*commonv3.RateLimitDescriptor) *rlsv3.RateLimitResponse {
		t.Helper()
		resp, err := f.client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "md", Descriptors: descs, HitsAddend: hits})
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	check := func(resp *rlsv3.RateLimitResponse, want string) {
		t.Helper()
		w := &structpb.Struct{}
		if err := protojson.Unmarshal([]byte(want), w); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(resp.GetDynamicMetadata(), w) {
			got, _ := protojson.Marshal(resp.GetDynamicMetadata())
			t.Fatalf("dynamic metadata\n got %s\nwant %s", got, want)
		}
	}
	override := d("b=1")
	override.Limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: 2}
	own := d("b=2")
	own.HitsAddend = wrapperspb.UInt64(1)

	check(call(0, d("a=1"), d("b=1"), d("free=1"), d("detailed=1")), `{
		"domain": "md",
		"descriptors": [{"entries": ["a=1"]}, {"entries": ["b=1"]}, {"entries": ["free=1"]}, {"entries": ["detailed=1"]}],
		"metadata": {"team": "payments", "tags": {"tier": "gold", "region": "eu", "owner": "ann"}, "list": [1, "x"], "extra": 1, "kind": "detailed"}}`)
	// a is now over its limit: its metadata is left out, b's comes first.
	check(call(1, d("a=1"), d("b=1")), `{
		"domain": "md", "hitsAddend": 1,
		"descriptors": [{"entries": ["a=1"]}, {"entries": ["b=1"]}],
		"metadata": {"team": "search", "tags": {"tier": "silver", "owner": "ann"}, "extra": 1}}`)
	// An override has no metadata; its limit and a descriptor's own
	// hits_addend are written out.
	check(call(0, override, own), `{
		"domain": "md",
		"descriptors": [{"entries": ["b=1"], "limit": "requests_per_unit:7 unit:MINUTE"}, {"entries": ["b=2"], "hitsAddend": 1}],
		"metadata": {"team": "search", "tags": {"tier": "silver", "owner": "ann"}, "extra": 1}}`)
	// Nothing passed with metadata: no metadata field. The merges above left
	// the rules' own metadata as it was.
	check(call(0, d("a=1")), `{"domain": "md", "descriptors": [{"entries": ["a=1"]}]}`)
	check(call(0, d("a=2")), `{"domain": "md", "descriptors": [{"entries": ["a=2"]}],
		"metadata": {"team": "payments", "tags": {"tier": "gold", "region": "eu"}, "list": [1, "x"]}}`)

	off := newFixtureSet(t, Options{}, 1, parseSet(t, metadataRules))
	resp, err := off.client.ShouldRateLimit(t.Context(), &rlsv3.RateLimitRequest{Domain: "md", Descriptors: []*commonv3.RateLimitDescriptor{d("a=1")}})
	if err != nil || resp.GetDynamicMetadata() != nil {
		t.Fatalf("without the option: %v, %v; want no dynamic metadata", resp.GetDynamicMetadata(), err)
	}
}
