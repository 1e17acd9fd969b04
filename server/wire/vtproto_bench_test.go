//go:build vtprotobuf

package wire

// The vtprotobuf marshaller go-control-plane generates for these messages
// (rls_vtproto.pb.go) is compiled only with the vtprotobuf build tag:
//
//	go test -tags vtprotobuf -run VTProto -bench 'Encode' ./server/wire/
//
// It is measured here against AppendResponse on the same answers.

import (
	"bytes"
	"slices"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// appendVT appends resp's encoding to b as vtprotobuf writes it: one sizing
// pass, then the message written back to front into exactly that many bytes.
func appendVT(tb testing.TB, b []byte, resp *rlsv3.RateLimitResponse) []byte {
	n := resp.SizeVT()
	start := len(b)
	b = slices.Grow(b, n)[:start+n]
	if _, err := resp.MarshalToSizedBufferVTStrict(b[start:]); err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestVTProtoMatchesWire: both encoders write the same bytes for the
// benchmark's answers and every encode case, so BenchmarkEncodeVTProto
// measures the same work as BenchmarkEncode.
func TestVTProtoMatchesWire(t *testing.T) {
	cases := encodeCases()
	cases["bench 1"], cases["bench 10"] = benchResponse(1), benchResponse(10)
	for name, resp := range cases {
		want := AppendResponse(nil, resp)
		if got := appendVT(t, nil, resp); !bytes.Equal(got, want) {
			t.Errorf("%s:\nvtproto %x\n   wire %x", name, got, want)
		}
	}
}

// BenchmarkEncodeVTProto is BenchmarkEncode's wire case written by
// vtprotobuf: the same answers, into a reused buffer.
func BenchmarkEncodeVTProto(b *testing.B) {
	for _, n := range []int{1, 10} {
		resp := benchResponse(n)
		want := len(AppendResponse(nil, resp))
		b.Run(name(n), func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 1024)
			for b.Loop() {
				buf = appendVT(b, buf[:0], resp)
			}
			if len(buf) != want || want == 0 {
				b.Fatalf("wrote %d bytes, want %d", len(buf), want)
			}
		})
	}
}
