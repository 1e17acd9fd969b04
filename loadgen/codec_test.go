package loadgen

import (
	"bytes"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestRequestBytesAsProto: every shape's requests are written as
// proto.Marshal writes them.
func TestRequestBytesAsProto(t *testing.T) {
	for _, shape := range Shapes() {
		for _, descs := range []int{1, 3, 10} {
			if shape == ShapeMix && descs != 1 {
				continue
			}
			for _, hits := range []uint32{0, 3} {
				b := newRequestBuilder(newKeySpace(shape, 1000), "bench", descs, hits)
				var buf []byte
				for seq := range uint64(50) {
					req := b.build(seq)
					want, err := proto.MarshalOptions{Deterministic: true}.Marshal(req)
					if err != nil {
						t.Fatal(err)
					}
					if buf = appendRequest(buf[:0], req); !bytes.Equal(buf, want) {
						t.Fatalf("%v %d descriptors, seq %d:\n got %x\nwant %x", shape, descs, seq, buf, want)
					}
				}
			}
		}
	}
}

func answerSeeds() [][]byte {
	var out [][]byte
	for _, r := range []*rlsv3.RateLimitResponse{
		{},
		{OverallCode: rlsv3.RateLimitResponse_OK},
		{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
			{Code: rlsv3.RateLimitResponse_OVER_LIMIT, LimitRemaining: 3, DurationUntilReset: durationpb.New(1e9),
				CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "n", RequestsPerUnit: 5, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}},
		}},
		{OverallCode: rlsv3.RateLimitResponse_Code(7)},
	} {
		b, _ := proto.Marshal(r)
		out = append(out, b)
	}
	return out
}

// FuzzReadAnswer holds the answer reader to proto.Unmarshal: whatever the
// bytes, an answer the protobuf runtime accepts is read, with its
// overall_code.
func FuzzReadAnswer(f *testing.F) {
	for _, s := range answerSeeds() {
		f.Add(s)
	}
	f.Add([]byte{0x08, 0x02, 0x08, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		var want rlsv3.RateLimitResponse
		werr := proto.Unmarshal(b, &want)
		var a answer
		err := a.read(b)
		if werr == nil && (err != nil || a.code != want.OverallCode) {
			t.Fatalf("proto reads code %v; read: %v %v", want.OverallCode, a.code, err)
		}
	})
}
