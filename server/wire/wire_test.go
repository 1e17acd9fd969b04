package wire

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// stripUnknown drops the unknown fields proto.Unmarshal keeps, at every depth:
// DecodeRequest skips them, and the daemon never reads them.
func stripUnknown(m protoreflect.Message) {
	m.SetUnknown(nil)
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		switch {
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				stripUnknown(v.List().Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			stripUnknown(v.Message())
		}
		return true
	})
}

// checkDecode holds DecodeRequest to proto.Unmarshal on b.
func checkDecode(t *testing.T, b []byte) {
	t.Helper()
	want := new(rlsv3.RateLimitRequest)
	wantErr := proto.Unmarshal(b, want)
	got := new(rlsv3.RateLimitRequest)
	gotErr := DecodeRequest(bytes.Clone(b), got)
	if (gotErr != nil) != (wantErr != nil) {
		t.Fatalf("input %x: DecodeRequest error %v, proto.Unmarshal error %v", b, gotErr, wantErr)
	}
	if wantErr != nil {
		return
	}
	stripUnknown(want.ProtoReflect())
	if !proto.Equal(got, want) {
		t.Fatalf("input %x:\n got %v\nwant %v", b, got, want)
	}
}

func desc(entries ...string) *commonv3.RateLimitDescriptor {
	d := &commonv3.RateLimitDescriptor{}
	for _, e := range entries {
		k, v, _ := strings.Cut(e, "=")
		d.Entries = append(d.Entries, &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	return d
}

func marshal(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// tag and field build hand-made encodings, for what proto.Marshal never
// writes: fields out of order, repeated, of the wrong wire type.
func tag(b []byte, num protowire.Number, typ protowire.Type) []byte {
	return protowire.AppendTag(b, num, typ)
}

func field(b []byte, num protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(tag(b, num, protowire.BytesType), v)
}

// decodeCases are requests DecodeRequest must read as proto.Unmarshal does; the
// fuzz test starts from them.
func decodeCases(t testing.TB) map[string][]byte {
	many := &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 3}
	for i := range 9 {
		var es []string
		for j := range i {
			es = append(es, fmt.Sprintf("k%d=v%d", j, i))
		}
		many.Descriptors = append(many.Descriptors, desc(es...))
	}
	entry := field(field(nil, entryKey, []byte("remote_address")), entryValue, []byte("10.0.0.1"))
	return map[string][]byte{
		"empty":          nil,
		"one descriptor": marshal(t, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*commonv3.RateLimitDescriptor{desc("remote_address=10.0.0.1")}}),
		"many descriptors past the block, one empty": marshal(t, many),
		"every descriptor field": marshal(t, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: []*commonv3.RateLimitDescriptor{{
			Entries:        desc("a=1", "b=").Entries,
			Limit:          &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 7, Unit: typev3.RateLimitUnit_HOUR, UnitMultiplier: wrapperspb.UInt32(3)},
			HitsAddend:     wrapperspb.UInt64(1 << 40),
			IsNegativeHits: true,
		}}}),
		"empty entry and empty descriptor": field(field(nil, reqDescriptors, field(nil, descEntries, nil)), reqDescriptors, nil),
		"domain twice, the last wins":      field(field(nil, reqDomain, []byte("a")), reqDomain, []byte("b")),
		"entries interleaved with limit": field(nil, reqDescriptors, field(field(field(nil, descEntries, entry),
			descLimit, protowire.AppendVarint(tag(nil, 1, protowire.VarintType), 5)), descEntries, entry)),
		"limit given twice is merged": field(nil, reqDescriptors, field(field(nil,
			descLimit, protowire.AppendVarint(tag(nil, 1, protowire.VarintType), 5)),
			descLimit, protowire.AppendVarint(tag(nil, 2, protowire.VarintType), 3))),
		"domain as a varint is unknown":   protowire.AppendVarint(tag(nil, reqDomain, protowire.VarintType), 9),
		"hits_addend as bytes is unknown": field(nil, reqHitsAddend, []byte("x")),
		"hits_addend wider than 32 bits":  protowire.AppendVarint(tag(nil, reqHitsAddend, protowire.VarintType), 1<<33+5),
		"unknown fields and a group": protowire.AppendVarint(tag(tag(field(nil, 99, []byte("zz")),
			7, protowire.StartGroupType), 7, protowire.EndGroupType), 0),
		"unknown fixed fields in an entry": field(nil, reqDescriptors, field(nil, descEntries,
			protowire.AppendFixed64(tag(protowire.AppendFixed32(tag(entry, 5, protowire.Fixed32Type), 1), 6, protowire.Fixed64Type), 2))),
		"invalid UTF-8 domain":        field(nil, reqDomain, []byte{0xff, 'a'}),
		"invalid UTF-8 entry value":   field(nil, reqDescriptors, field(nil, descEntries, field(nil, entryValue, []byte{0xc3}))),
		"truncated length":            tag(nil, reqDomain, protowire.BytesType),
		"length past the end":         append(tag(nil, reqDomain, protowire.BytesType), 5, 'a'),
		"field number zero":           {0x02, 0x00},
		"reserved wire type":          {0x0e},
		"unterminated group":          tag(nil, 8, protowire.StartGroupType),
		"mismatched end group":        tag(tag(nil, 8, protowire.StartGroupType), 9, protowire.EndGroupType),
		"varint of eleven bytes":      append(tag(nil, reqHitsAddend, protowire.VarintType), bytes.Repeat([]byte{0xff}, 10)...),
		"bad limit inside descriptor": field(nil, reqDescriptors, field(nil, descLimit, []byte{0x0a, 0x05})),
	}
}

func TestDecodeMatchesProto(t *testing.T) {
	for name, b := range decodeCases(t) {
		t.Run(name, func(t *testing.T) { checkDecode(t, b) })
	}
}

// TestDecodeKeepsEntriesApart: each descriptor's Entries must hold its own
// entries, also once they spill past the block and a slab fills mid-list.
func TestDecodeKeepsEntriesApart(t *testing.T) {
	for _, shape := range [][]int{{4, 1}, {3, 3}, {1, 8, 1}, {5, 5, 5, 5}, {0, 16, 0, 2}, {2, 2, 2, 2, 2, 2, 2}} {
		req := &rlsv3.RateLimitRequest{Domain: "d"}
		for i, n := range shape {
			var es []string
			for j := range n {
				es = append(es, fmt.Sprintf("d%d=e%d", i, j))
			}
			req.Descriptors = append(req.Descriptors, desc(es...))
		}
		got := new(rlsv3.RateLimitRequest)
		if err := DecodeRequest(marshal(t, req), got); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(got, req) {
			t.Fatalf("shape %v:\n got %v\nwant %v", shape, got, req)
		}
	}
}

func FuzzDecodeRequest(f *testing.F) {
	for _, b := range decodeCases(f) {
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) { checkDecode(t, b) })
}

// checkEncode holds AppendResponse to proto.Marshal on resp.
func checkEncode(t *testing.T, resp *rlsv3.RateLimitResponse) {
	t.Helper()
	if !Writable(resp) {
		t.Fatalf("not writable: %v", resp)
	}
	want := marshal(t, resp)
	got := AppendResponse([]byte("prefix"), resp)
	if !bytes.Equal(got[6:], want) || string(got[:6]) != "prefix" {
		t.Fatalf("%v:\n got %x\nwant %x", resp, got[6:], want)
	}
	if n := ResponseSize(resp); n != len(want) {
		t.Fatalf("ResponseSize %d, encoding is %d bytes", n, len(want))
	}
}

func encodeCases() map[string]*rlsv3.RateLimitResponse {
	limit := &rlsv3.RateLimitResponse_RateLimit{Name: "edge.remote_address", RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE}
	return map[string]*rlsv3.RateLimitResponse{
		"empty": {},
		"one OK status": {OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			Code: rlsv3.RateLimitResponse_OK, CurrentLimit: limit, LimitRemaining: 99, DurationUntilReset: &durationpb.Duration{Seconds: 0, Nanos: 600_000_000},
		}}},
		"over limit, a multiplier, headers": {
			OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{
				{Code: rlsv3.RateLimitResponse_OVER_LIMIT, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 1 << 31, Unit: rlsv3.RateLimitResponse_RateLimit_DAY, UnitMultiplier: wrapperspb.UInt32(0)}, DurationUntilReset: &durationpb.Duration{Seconds: 86399, Nanos: 999_999_999}},
				{Code: rlsv3.RateLimitResponse_OK, LimitRemaining: 1<<32 - 1},
				{},
			},
			ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "x-ratelimit-limit", Value: "100"}, {Key: "raw", RawValue: []byte{0, 1}}, {}},
			RequestHeadersToAdd:  []*corev3.HeaderValue{{Key: "k", Value: "v"}},
		},
		"negative and unknown enum values, negative duration": {
			OverallCode: -3,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
				Code: 77, CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Unit: -1, UnitMultiplier: wrapperspb.UInt32(7)},
				DurationUntilReset: &durationpb.Duration{Seconds: -5, Nanos: -1},
			}},
		},
	}
}

func TestEncodeMatchesProto(t *testing.T) {
	for name, resp := range encodeCases() {
		t.Run(name, func(t *testing.T) { checkEncode(t, resp) })
	}
}

// TestNotWritable: fields AppendResponse does not write send the answer to
// the protobuf runtime instead.
func TestNotWritable(t *testing.T) {
	for name, resp := range map[string]*rlsv3.RateLimitResponse{
		"raw body":         {RawBody: []byte("x")},
		"dynamic metadata": {DynamicMetadata: &structpb.Struct{}},
		"quota":            {Quota: &rlsv3.RateLimitResponse_Quota{}},
		"status quota":     {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Quota: &rlsv3.RateLimitResponse_Quota{}}}},
		"nil status":       {Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{nil}},
		"nil header":       {ResponseHeadersToAdd: []*corev3.HeaderValue{nil}},
	} {
		if Writable(resp) {
			t.Errorf("%s: Writable", name)
		}
	}
}

func FuzzEncodeResponse(f *testing.F) {
	f.Add(int32(1), uint8(2), int32(1), uint32(100), int32(2), "name", uint32(7), true, int64(3), int32(5), "k", "v", []byte(nil))
	f.Add(int32(-1), uint8(0), int32(99), uint32(0), int32(-7), "", uint32(0), false, int64(-1), int32(-1), "", "", []byte{0})
	f.Fuzz(func(t *testing.T, overall int32, n uint8, code int32, rpu uint32, unit int32, name string, mult uint32, hasMult bool,
		secs int64, nanos int32, hk, hv string, raw []byte) {
		resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(overall)}
		for i := range int(n % 5) {
			st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(code + int32(i)), LimitRemaining: rpu >> i}
			if i%2 == 0 {
				st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: name, RequestsPerUnit: rpu, Unit: rlsv3.RateLimitResponse_RateLimit_Unit(unit)}
				if hasMult {
					st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(mult)
				}
			}
			if i != 1 {
				st.DurationUntilReset = &durationpb.Duration{Seconds: secs, Nanos: nanos}
			}
			resp.Statuses = append(resp.Statuses, st)
		}
		if hk != "" || hv != "" || raw != nil {
			resp.ResponseHeadersToAdd = []*corev3.HeaderValue{{Key: hk, Value: hv, RawValue: raw}}
		}
		if _, err := proto.Marshal(resp); err != nil {
			return // invalid UTF-8 in a string: the runtime refuses; the daemon never builds one
		}
		checkEncode(t, resp)
	})
}
