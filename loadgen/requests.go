package loadgen

import (
	"fmt"
	"strconv"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Shape is the form of each descriptor in a request, after the rate-limit actions
// Envoy routes commonly carry.
type Shape string

const (
	// ShapeGenericKey is Envoy's generic_key action: one entry
	// {"generic_key", "key-<i>"}.
	ShapeGenericKey Shape = "generic_key"
	// ShapeRemoteAddress is Envoy's remote_address action, a per-client-IP limit: one
	// entry {"remote_address", "10.a.b.c"}.
	ShapeRemoteAddress Shape = "remote_address"
	// ShapeNested is a request_headers action followed by remote_address, the usual
	// "per IP on this path" pair: {"path", NestedPath}, {"remote_address", "10.a.b.c"}.
	ShapeNested Shape = "nested"
	// ShapeMix is a realistic request: three descriptors, and a fourth on one
	// request in ten. {generic_key=api} (a fixed rule), {path=/api/v1/items/N}
	// (a wildcard rule, N in 0..MixPaths-1), {remote_address=10.a.b.c} (a
	// per-value rule over the cardinality) and, on every tenth request,
	// {header_match=abuse} (one key whose limit binds, so about 10% of answers
	// are OVER_LIMIT against docs/bench/mix.yaml). --descriptors does not apply.
	ShapeMix Shape = "mix"
)

// MixPaths is how many distinct paths ShapeMix's wildcard descriptor carries.
const MixPaths = 1000

// MixOverEvery: one ShapeMix request in this many carries the binding descriptor.
const MixOverEvery = 10

// NestedPath is the value of the first entry of a ShapeNested descriptor. It is the
// same in every request: the key space is the client addresses below it.
const NestedPath = "/api/v1/items"

// Shapes lists every Shape.
func Shapes() []Shape { return []Shape{ShapeGenericKey, ShapeRemoteAddress, ShapeNested, ShapeMix} }

// ParseShape returns the Shape named s.
func ParseShape(s string) (Shape, error) {
	for _, sh := range Shapes() {
		if string(sh) == s {
			return sh, nil
		}
	}
	names := make([]string, 0, len(Shapes()))
	for _, sh := range Shapes() {
		names = append(names, string(sh))
	}
	return "", fmt.Errorf("parse shape: %q is not one of %s", s, strings.Join(names, ", "))
}

// MaxCardinality is the largest key space a run can cycle through.
const MaxCardinality = 10_000_000

// tableMax is the largest key space whose values are formatted once, up front, so
// that building a request allocates nothing. Larger spaces format each value as it
// is used: one small allocation per descriptor.
const tableMax = 1 << 20

// keySpace maps a key index to a descriptor value. It is read-only once built and
// safe for concurrent use.
type keySpace struct {
	shape Shape
	n     uint64
	table []string // every value when n <= tableMax; nil otherwise
}

func newKeySpace(shape Shape, n int) *keySpace {
	ks := &keySpace{shape: shape, n: uint64(max(n, 1))}
	if ks.n > tableMax {
		return ks
	}
	// One backing string for all values keeps this to three allocations even for a
	// million keys, and gives the garbage collector a single object to look at.
	var arena []byte
	ends := make([]int, ks.n)
	for i := range ks.n {
		arena = appendValue(arena, shape, i)
		ends[i] = len(arena)
	}
	all := string(arena)
	ks.table = make([]string, ks.n)
	start := 0
	for i, end := range ends {
		ks.table[i] = all[start:end]
		start = end
	}
	return ks
}

// value returns the value for key index k, taken modulo the cardinality.
func (ks *keySpace) value(k uint64) string {
	k %= ks.n
	if ks.table != nil {
		return ks.table[k]
	}
	var buf [24]byte
	return string(appendValue(buf[:0], ks.shape, k))
}

// appendValue formats the value for key index k.
func appendValue(dst []byte, shape Shape, k uint64) []byte {
	if shape == ShapeGenericKey {
		return strconv.AppendUint(append(dst, "key-"...), k, 10)
	}
	return appendIPv4(dst, k)
}

// appendIPv4 formats a 10.0.0.0/8 address that is a bijection of k below 2^24, so
// every cardinality up to MaxCardinality gets that many distinct addresses. The
// scramble keeps neighbouring indexes from being neighbouring addresses, as client
// addresses are in real traffic.
func appendIPv4(dst []byte, k uint64) []byte {
	x := scramble24(uint32(k))
	dst = append(dst, "10."...)
	dst = strconv.AppendUint(dst, uint64(x>>16), 10)
	dst = append(dst, '.')
	dst = strconv.AppendUint(dst, uint64(x>>8&0xff), 10)
	dst = append(dst, '.')
	return strconv.AppendUint(dst, uint64(x&0xff), 10)
}

// scramble24 is a permutation of [0, 2^24); higher bits of k are ignored.
func scramble24(k uint32) uint32 {
	const mask = 1<<24 - 1
	x := k & mask
	x = (x * 0x9E3779) & mask // an odd multiplier permutes the residues mod 2^24
	x ^= x >> 12              // so does a xorshift
	return (x * 0x2545F5) & mask
}

// requestBuilder fills one reusable RateLimitRequest for successive sequence
// numbers. Descriptor j of request s uses key index s·D+j, so requests walk the key
// space round-robin and the descriptors of one request are distinct whenever the
// cardinality is at least D.
//
// Not safe for concurrent use: each worker owns one, and the request it returns is
// only valid until the next build. grpc-go is done with a request message when
// Invoke returns, so sequential reuse is sound.
type requestBuilder struct {
	keys *keySpace
	req  *rlsv3.RateLimitRequest
	vary []*ratelimitv3.RateLimitDescriptor_Entry // the entry that changes, one per descriptor
	mix  *mixRequest                              // ShapeMix's request, instead of the above
}

// mixRequest is ShapeMix's reusable request: all four descriptors, of which
// build sends three or four.
type mixRequest struct {
	all   []*ratelimitv3.RateLimitDescriptor
	path  *ratelimitv3.RateLimitDescriptor_Entry
	addr  *ratelimitv3.RateLimitDescriptor_Entry
	paths []string
}

func newMixRequest() *mixRequest {
	m := &mixRequest{
		path:  &ratelimitv3.RateLimitDescriptor_Entry{Key: "path"},
		addr:  &ratelimitv3.RateLimitDescriptor_Entry{Key: "remote_address"},
		paths: make([]string, MixPaths),
	}
	for i := range m.paths {
		m.paths[i] = "/api/v1/items/" + strconv.Itoa(i)
	}
	m.all = []*ratelimitv3.RateLimitDescriptor{
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "api"}}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{m.path}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{m.addr}},
		{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "header_match", Value: "abuse"}}},
	}
	return m
}

func newRequestBuilder(keys *keySpace, domain string, descriptors int, hitsAddend uint32) *requestBuilder {
	if keys.shape == ShapeMix {
		return &requestBuilder{keys: keys, req: &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: hitsAddend}, mix: newMixRequest()}
	}
	b := &requestBuilder{
		keys: keys,
		req: &rlsv3.RateLimitRequest{
			Domain:      domain,
			HitsAddend:  hitsAddend,
			Descriptors: make([]*ratelimitv3.RateLimitDescriptor, descriptors),
		},
		vary: make([]*ratelimitv3.RateLimitDescriptor_Entry, descriptors),
	}
	for j := range b.req.Descriptors {
		var entries []*ratelimitv3.RateLimitDescriptor_Entry
		switch keys.shape {
		case ShapeGenericKey:
			entries = []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "generic_key"}}
		case ShapeRemoteAddress:
			entries = []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "remote_address"}}
		default: // ShapeNested
			entries = []*ratelimitv3.RateLimitDescriptor_Entry{
				{Key: "path", Value: NestedPath},
				{Key: "remote_address"},
			}
		}
		b.vary[j] = entries[len(entries)-1]
		b.req.Descriptors[j] = &ratelimitv3.RateLimitDescriptor{Entries: entries}
	}
	return b
}

// build returns the request for sequence number seq.
func (b *requestBuilder) build(seq uint64) *rlsv3.RateLimitRequest {
	if m := b.mix; m != nil {
		m.path.Value = m.paths[scramble24(uint32(seq))%MixPaths]
		m.addr.Value = b.keys.value(seq)
		b.req.Descriptors = m.all[:3]
		if seq%MixOverEvery == 0 {
			b.req.Descriptors = m.all
		}
		return b.req
	}
	base := seq * uint64(len(b.vary))
	for j, e := range b.vary {
		e.Value = b.keys.value(base + uint64(j))
	}
	return b.req
}
