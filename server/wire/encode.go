package wire

import (
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Field numbers of the answer, in the order the protobuf runtime writes them:
// by number.
const (
	respOverallCode     = 1
	respStatuses        = 2
	respResponseHeaders = 3
	respRequestHeaders  = 4

	statusCode           = 1
	statusCurrentLimit   = 2
	statusLimitRemaining = 3
	statusDurationReset  = 4

	limitRequestsPerUnit = 1
	limitUnit            = 2
	limitName            = 3
	limitUnitMultiplier  = 4

	headerKey      = 1
	headerValue    = 2
	headerRawValue = 3

	durationSeconds = 1
	durationNanos   = 2

	wrapperValue = 1
)

// Writable reports whether AppendResponse writes resp exactly as proto.Marshal
// would: resp is not nil, sets none of raw_body, dynamic_metadata and quota,
// carries no unknown fields, and its strings are UTF-8. Anything else goes to
// the protobuf runtime.
func Writable(resp *rlsv3.RateLimitResponse) bool {
	if resp == nil || resp.RawBody != nil || resp.DynamicMetadata != nil || resp.Quota != nil || !known(resp) {
		return false
	}
	for _, st := range resp.Statuses {
		if st == nil || st.Quota != nil || !known(st) {
			return false
		}
		if l := st.CurrentLimit; l != nil && (!known(l) || !utf8.ValidString(l.Name) || (l.UnitMultiplier != nil && !known(l.UnitMultiplier))) {
			return false
		}
		if d := st.DurationUntilReset; d != nil && !known(d) {
			return false
		}
	}
	for _, hs := range [][]*corev3.HeaderValue{resp.ResponseHeadersToAdd, resp.RequestHeadersToAdd} {
		for _, h := range hs {
			if h == nil || !known(h) || !utf8.ValidString(h.Key) || !utf8.ValidString(h.Value) {
				return false
			}
		}
	}
	return true
}

// known reports that m carries no unknown fields, which only a decoded
// message can have.
func known(m proto.Message) bool { return len(m.ProtoReflect().GetUnknown()) == 0 }

// ResponseSize is the length of AppendResponse's encoding of resp.
func ResponseSize(resp *rlsv3.RateLimitResponse) int {
	n := sizeEnum(respOverallCode, int32(resp.OverallCode))
	for _, st := range resp.Statuses {
		n += sizeMessage(respStatuses, statusSize(st))
	}
	for _, h := range resp.ResponseHeadersToAdd {
		n += sizeMessage(respResponseHeaders, headerSize(h))
	}
	for _, h := range resp.RequestHeadersToAdd {
		n += sizeMessage(respRequestHeaders, headerSize(h))
	}
	return n
}

// AppendResponse appends resp's encoding to b. resp must be Writable; the
// bytes are those proto.Marshal writes.
func AppendResponse(b []byte, resp *rlsv3.RateLimitResponse) []byte {
	b = appendEnum(b, respOverallCode, int32(resp.OverallCode))
	for _, st := range resp.Statuses {
		b = protowire.AppendTag(b, respStatuses, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(statusSize(st)))
		b = appendStatus(b, st)
	}
	for _, h := range resp.ResponseHeadersToAdd {
		b = appendHeader(b, respResponseHeaders, h)
	}
	for _, h := range resp.RequestHeadersToAdd {
		b = appendHeader(b, respRequestHeaders, h)
	}
	return b
}

func statusSize(st *rlsv3.RateLimitResponse_DescriptorStatus) int {
	n := sizeEnum(statusCode, int32(st.Code))
	if l := st.CurrentLimit; l != nil {
		n += sizeMessage(statusCurrentLimit, limitSize(l))
	}
	n += sizeUint(statusLimitRemaining, uint64(st.LimitRemaining))
	if d := st.DurationUntilReset; d != nil {
		n += sizeMessage(statusDurationReset, durationSize(d))
	}
	return n
}

func appendStatus(b []byte, st *rlsv3.RateLimitResponse_DescriptorStatus) []byte {
	b = appendEnum(b, statusCode, int32(st.Code))
	if l := st.CurrentLimit; l != nil {
		b = protowire.AppendTag(b, statusCurrentLimit, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(limitSize(l)))
		b = appendUint(b, limitRequestsPerUnit, uint64(l.RequestsPerUnit))
		b = appendEnum(b, limitUnit, int32(l.Unit))
		b = appendString(b, limitName, l.Name)
		if m := l.UnitMultiplier; m != nil {
			b = protowire.AppendTag(b, limitUnitMultiplier, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(sizeUint(wrapperValue, uint64(m.Value))))
			b = appendUint(b, wrapperValue, uint64(m.Value))
		}
	}
	b = appendUint(b, statusLimitRemaining, uint64(st.LimitRemaining))
	if d := st.DurationUntilReset; d != nil {
		b = protowire.AppendTag(b, statusDurationReset, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(durationSize(d)))
		b = appendUint(b, durationSeconds, uint64(d.Seconds))
		b = appendEnum(b, durationNanos, d.Nanos)
	}
	return b
}

func limitSize(l *rlsv3.RateLimitResponse_RateLimit) int {
	n := sizeUint(limitRequestsPerUnit, uint64(l.RequestsPerUnit)) +
		sizeEnum(limitUnit, int32(l.Unit)) +
		sizeString(limitName, l.Name)
	if m := l.UnitMultiplier; m != nil {
		n += sizeMessage(limitUnitMultiplier, sizeUint(wrapperValue, uint64(m.Value)))
	}
	return n
}

func durationSize(d *durationpb.Duration) int {
	return sizeUint(durationSeconds, uint64(d.Seconds)) + sizeEnum(durationNanos, d.Nanos)
}

func headerSize(h *corev3.HeaderValue) int {
	return sizeString(headerKey, h.Key) + sizeString(headerValue, h.Value) + sizeBytes(headerRawValue, h.RawValue)
}

func appendHeader(b []byte, num protowire.Number, h *corev3.HeaderValue) []byte {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(headerSize(h)))
	b = appendString(b, headerKey, h.Key)
	b = appendString(b, headerValue, h.Value)
	if len(h.RawValue) > 0 {
		b = protowire.AppendTag(b, headerRawValue, protowire.BytesType)
		b = protowire.AppendBytes(b, h.RawValue)
	}
	return b
}

// The helpers below write proto3 scalars: a zero value is not written.

func sizeUint(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return protowire.SizeTag(num) + protowire.SizeVarint(v)
}

func appendUint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

// An enum or int32 is written as its 64-bit sign extension.
func sizeEnum(num protowire.Number, v int32) int { return sizeUint(num, uint64(int64(v))) }

func appendEnum(b []byte, num protowire.Number, v int32) []byte {
	return appendUint(b, num, uint64(int64(v)))
}

func sizeString(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return sizeMessage(num, len(s))
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	if s == "" {
		return b
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), s)
}

func sizeBytes(num protowire.Number, v []byte) int {
	if len(v) == 0 {
		return 0
	}
	return sizeMessage(num, len(v))
}

// sizeMessage is the size of a length-delimited field of n bytes.
func sizeMessage(num protowire.Number, n int) int {
	return protowire.SizeTag(num) + protowire.SizeVarint(uint64(n)) + n
}
