package server

import (
	"fmt"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// How many buckets one Envoy's periodic RLQS report can carry: the whole
// report is one gRPC message, within MaxRecvMsgSize. With the example
// config's per-IP login bucket ({header_match: login, remote_address: an
// IPv4 address}), the README's figure: 15,000 fit, 17,000 do not.
func TestRLQSReportSizeLimitInBuckets(t *testing.T) {
	size := func(n int) int {
		r := &rlqsv3.RateLimitQuotaUsageReports{Domain: "edge"}
		for i := range n {
			id := map[string]string{"header_match": "login", "remote_address": fmt.Sprintf("10.%d.%d.%d", i>>16&255, i>>8&255, i&255)}
			r.BucketQuotaUsages = append(r.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
				BucketId: &rlqsv3.BucketId{Bucket: id}, TimeElapsed: durationpb.New(5 * time.Second),
				NumRequestsAllowed: 3, NumRequestsDenied: 1,
			})
		}
		return proto.Size(r)
	}
	if got := size(15000); got > MaxRecvMsgSize {
		t.Errorf("15,000 buckets: %d bytes, over the %d-byte limit", got, MaxRecvMsgSize)
	}
	if got := size(17000); got <= MaxRecvMsgSize {
		t.Errorf("17,000 buckets: %d bytes, within the %d-byte limit", got, MaxRecvMsgSize)
	}
	t.Logf("bytes per bucket: %.1f", float64(size(1000)-size(0))/1000)
}
