package wire

import (
	"slices"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Field numbers of the answer, in the order the protobuf runtime writes them:
// by number. Each is below 16, so each tag is one byte.
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

// AppendResponse appends resp's encoding to b. resp must be Writable, and
// must not change while it is written; the bytes are those proto.Marshal
// writes.
func AppendResponse(b []byte, resp *rlsv3.RateLimitResponse) []byte {
	b, _ = appendSized(b, resp, ResponseSize(resp))
	return b
}

// appendSized is AppendResponse given n, resp's ResponseSize. The message is
// written back to front into exactly n bytes: each nested message is written
// before its length, which is then known, so nothing is sized twice. ok is
// false, and b returned as it was, when the message took fewer bytes than n,
// which only a resp changed since it was sized does. A resp that grew since
// would be written past the front of the space and panic; callers size and
// write in one call, on an answer nobody else holds while it is written (the
// service builds each answer for its call; the limit messages it shares never
// change). A recover here would cost 3–4 ns of the 28 a one-descriptor
// answer takes to encode, on every answer, for a case no caller reaches.
func appendSized(b []byte, resp *rlsv3.RateLimitResponse, n int) (_ []byte, ok bool) {
	start := len(b)
	b = slices.Grow(b, n)[:start+n]
	out := b[start:]
	i := len(out)
	for j := len(resp.RequestHeadersToAdd) - 1; j >= 0; j-- {
		i = putHeader(out, i, respRequestHeaders, resp.RequestHeadersToAdd[j])
	}
	for j := len(resp.ResponseHeadersToAdd) - 1; j >= 0; j-- {
		i = putHeader(out, i, respResponseHeaders, resp.ResponseHeadersToAdd[j])
	}
	for j := len(resp.Statuses) - 1; j >= 0; j-- {
		end := i
		i = putStatus(out, i, resp.Statuses[j])
		i = putLength(out, i, respStatuses, end-i)
	}
	if i = putEnum(out, i, respOverallCode, int32(resp.OverallCode)); i != 0 {
		return b[:start], false
	}
	return b, true
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

// putStatus writes st's fields ending at b[i], last field first, and returns
// where they begin.
func putStatus(b []byte, i int, st *rlsv3.RateLimitResponse_DescriptorStatus) int {
	if d := st.DurationUntilReset; d != nil {
		end := i
		i = putEnum(b, i, durationNanos, d.Nanos)
		i = putUint(b, i, durationSeconds, uint64(d.Seconds))
		i = putLength(b, i, statusDurationReset, end-i)
	}
	i = putUint(b, i, statusLimitRemaining, uint64(st.LimitRemaining))
	if l := st.CurrentLimit; l != nil {
		end := i
		if m := l.UnitMultiplier; m != nil {
			mend := i
			i = putUint(b, i, wrapperValue, uint64(m.Value))
			i = putLength(b, i, limitUnitMultiplier, mend-i)
		}
		i = putString(b, i, limitName, l.Name)
		i = putEnum(b, i, limitUnit, int32(l.Unit))
		i = putUint(b, i, limitRequestsPerUnit, uint64(l.RequestsPerUnit))
		i = putLength(b, i, statusCurrentLimit, end-i)
	}
	return putEnum(b, i, statusCode, int32(st.Code))
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

// putHeader writes h as field num ending at b[i], and returns where it begins.
func putHeader(b []byte, i int, num protowire.Number, h *corev3.HeaderValue) int {
	end := i
	if len(h.RawValue) > 0 {
		i -= len(h.RawValue)
		copy(b[i:], h.RawValue)
		i = putLength(b, i, headerRawValue, len(h.RawValue))
	}
	i = putString(b, i, headerValue, h.Value)
	i = putString(b, i, headerKey, h.Key)
	return putLength(b, i, num, end-i)
}

// The helpers below size and write proto3 scalars: a zero value is not
// written. The put helpers write back to front: each writes its field so that
// it ends at b[i], and returns where it begins.

func sizeUint(num protowire.Number, v uint64) int {
	if v == 0 {
		return 0
	}
	return 1 + protowire.SizeVarint(v) // the tag's one byte, and v
}

func putUint(b []byte, i int, num protowire.Number, v uint64) int {
	if v == 0 {
		return i
	}
	return putTag(b, putVarint(b, i, v), num, protowire.VarintType)
}

// An enum or int32 is written as its 64-bit sign extension.
func sizeEnum(num protowire.Number, v int32) int { return sizeUint(num, uint64(int64(v))) }

func putEnum(b []byte, i int, num protowire.Number, v int32) int {
	return putUint(b, i, num, uint64(int64(v)))
}

func sizeString(num protowire.Number, s string) int {
	if s == "" {
		return 0
	}
	return sizeMessage(num, len(s))
}

func putString(b []byte, i int, num protowire.Number, s string) int {
	if s == "" {
		return i
	}
	i -= len(s)
	copy(b[i:], s)
	return putLength(b, i, num, len(s))
}

func sizeBytes(num protowire.Number, v []byte) int {
	if len(v) == 0 {
		return 0
	}
	return sizeMessage(num, len(v))
}

// putLength writes the tag and length of a length-delimited field of n
// bytes, which end at b[i+n].
func putLength(b []byte, i int, num protowire.Number, n int) int {
	return putTag(b, putVarint(b, i, uint64(n)), num, protowire.BytesType)
}

// putTag writes a field's tag ending at b[i]: one byte, as every field number
// here is below 16.
func putTag(b []byte, i int, num protowire.Number, typ protowire.Type) int {
	i--
	b[i] = byte(num)<<3 | byte(typ)
	return i
}

// putVarint writes v as a varint ending at b[i].
func putVarint(b []byte, i int, v uint64) int {
	if v < 0x80 {
		i--
		b[i] = byte(v)
		return i
	}
	i -= protowire.SizeVarint(v)
	j := i
	for v >= 0x80 {
		b[j] = byte(v) | 0x80
		v >>= 7
		j++
	}
	b[j] = byte(v)
	return i
}

// sizeMessage is the size of a length-delimited field of n bytes.
func sizeMessage(num protowire.Number, n int) int {
	return 1 + protowire.SizeVarint(uint64(n)) + n
}
