package wire

import (
	"errors"
	"unicode/utf8"
	"unsafe"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

var (
	errTruncated = errors.New("wire: request truncated or malformed")
	errUTF8      = errors.New("wire: string field contains invalid UTF-8")
)

// Field numbers, from envoy/service/ratelimit/v3/rls.proto and
// envoy/extensions/common/ratelimit/v3/ratelimit.proto.
const (
	reqDomain      = 1
	reqDescriptors = 2
	reqHitsAddend  = 3

	descEntries        = 1
	descLimit          = 2
	descHitsAddend     = 3
	descIsNegativeHits = 4

	entryKey   = 1
	entryValue = 2
)

// block holds a request of the usual shape in one allocation: its bytes, and a
// descriptor of up to two entries. Larger requests take further slabs.
type block struct {
	raw   [inlineBytes]byte
	descs [1]commonv3.RateLimitDescriptor
	dptrs [1]*commonv3.RateLimitDescriptor
	ents  [2]commonv3.RateLimitDescriptor_Entry
	eptrs [2]*commonv3.RateLimitDescriptor_Entry
}

// decoder hands out descriptors and entries from a block, then from slabs that
// double. A slab, once handed out from, is never moved, so the pointers stay
// good.
type decoder struct {
	descs []commonv3.RateLimitDescriptor
	ents  []commonv3.RateLimitDescriptor_Entry
	eptrs []*commonv3.RateLimitDescriptor_Entry // descriptors' Entries are sub-slices
	alias bool                                  // strings may point into the input
	arena []byte                                // strings' copies otherwise; a full one is left, never grown
}

func newDecoder(b *block) decoder {
	return decoder{descs: b.descs[:0], ents: b.ents[:0], eptrs: b.eptrs[:0]}
}

func (d *decoder) desc() *commonv3.RateLimitDescriptor {
	if len(d.descs) == cap(d.descs) {
		d.descs = make([]commonv3.RateLimitDescriptor, 0, max(2*cap(d.descs), 2))
	}
	d.descs = d.descs[:len(d.descs)+1]
	return &d.descs[len(d.descs)-1]
}

func (d *decoder) entry() *commonv3.RateLimitDescriptor_Entry {
	if len(d.ents) == cap(d.ents) {
		d.ents = make([]commonv3.RateLimitDescriptor_Entry, 0, max(2*cap(d.ents), 2))
	}
	d.ents = d.ents[:len(d.ents)+1]
	return &d.ents[len(d.ents)-1]
}

// appendEntry adds e to the list of the descriptor being decoded, which is
// d.eptrs[start:]; it returns the list's new start. A full slab is left to the
// descriptors already decoded, and the list moves to a new one.
func (d *decoder) appendEntry(start int, e *commonv3.RateLimitDescriptor_Entry) int {
	if len(d.eptrs) == cap(d.eptrs) {
		tail := d.eptrs[start:]
		next := make([]*commonv3.RateLimitDescriptor_Entry, 0, max(2*cap(d.eptrs), 2*len(tail)+2))
		d.eptrs = append(next, tail...)
		start = 0
	}
	d.eptrs = append(d.eptrs, e)
	return start
}

// inlineBytes is how long a request may be to keep its bytes in its block.
// Envoy's usual request (a domain, a descriptor of a few entries) is shorter.
const inlineBytes = 128

// DecodeRequest decodes b into req, which must be empty, with the semantics of
// proto.Unmarshal: fields in any order, a repeated scalar's last value wins, a
// message field given twice is merged, known fields of the wrong wire type and
// unknown fields are skipped (not kept), and strings must be UTF-8. req's
// strings never point into b: b may change afterwards. A short request is
// copied into the one block the decoded request lives in.
func DecodeRequest(b []byte, req *rlsv3.RateLimitRequest) error {
	blk := new(block)
	if len(b) <= len(blk.raw) {
		return decodeRequest(blk, blk.raw[:copy(blk.raw[:], b)], true, req)
	}
	return decodeRequest(blk, b, false, req)
}

// presizeMax bounds the slabs sized from count: a request's tags are not yet
// validated then, and a hostile one could claim a million descriptors and
// fail on its first. Past these, slabs double as decoding proves them needed.
const (
	presizeDescs   = 64
	presizeEntries = 256
)

// decodeRequest decodes b into req. With alias, b is blk.raw, a request short
// enough to live in its block, and req's strings point into it; otherwise
// they are copied into arena chunks of their own, so that a string kept
// after the request (an over-limit sample's domain, say) keeps only strings
// alive, never the request's other bytes.
func decodeRequest(blk *block, b []byte, alias bool, req *rlsv3.RateLimitRequest) error {
	d := newDecoder(blk)
	d.alias = alias
	if descs, ents := count(b); descs > len(blk.descs) || ents > len(blk.ents) {
		// Past the block: one slab of each, sized by a first pass over the
		// tags, instead of slabs that double.
		descs, ents = min(descs, presizeDescs), min(ents, presizeEntries)
		d.descs = make([]commonv3.RateLimitDescriptor, 0, descs)
		d.ents = make([]commonv3.RateLimitDescriptor_Entry, 0, ents)
		d.eptrs = make([]*commonv3.RateLimitDescriptor_Entry, 0, ents)
		req.Descriptors = make([]*commonv3.RateLimitDescriptor, 0, descs)
	}
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errTruncated
		}
		b = b[n:]
		switch {
		case num == reqDomain && typ == protowire.BytesType:
			s, n, err := d.stringField(b)
			if err != nil {
				return err
			}
			req.Domain = s
			b = b[n:]
		case num == reqDescriptors && typ == protowire.BytesType:
			m, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errTruncated
			}
			desc := d.desc()
			if err := d.decodeDescriptor(m, desc); err != nil {
				return err
			}
			if req.Descriptors == nil {
				req.Descriptors = blk.dptrs[:0]
			}
			req.Descriptors = append(req.Descriptors, desc)
			b = b[n:]
		case num == reqHitsAddend && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errTruncated
			}
			req.HitsAddend = uint32(v)
			b = b[n:]
		default:
			n, err := skipField(num, typ, b)
			if err != nil {
				return err
			}
			b = b[n:]
		}
	}
	return nil
}

func (d *decoder) decodeDescriptor(b []byte, desc *commonv3.RateLimitDescriptor) error {
	start, entries := len(d.eptrs), 0
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errTruncated
		}
		b = b[n:]
		switch {
		case num == descEntries && typ == protowire.BytesType:
			m, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return errTruncated
			}
			e := d.entry()
			if err := d.decodeEntry(m, e); err != nil {
				return err
			}
			start = d.appendEntry(start, e)
			entries++
			b = b[n:]
		case num == descLimit && typ == protowire.BytesType:
			if desc.Limit == nil {
				desc.Limit = new(commonv3.RateLimitDescriptor_RateLimitOverride)
			}
			n, err := merge(b, desc.Limit)
			if err != nil {
				return err
			}
			b = b[n:]
		case num == descHitsAddend && typ == protowire.BytesType:
			if desc.HitsAddend == nil {
				desc.HitsAddend = new(wrapperspb.UInt64Value)
			}
			n, err := merge(b, desc.HitsAddend)
			if err != nil {
				return err
			}
			b = b[n:]
		case num == descIsNegativeHits && typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return errTruncated
			}
			desc.IsNegativeHits = v != 0
			b = b[n:]
		default:
			n, err := skipField(num, typ, b)
			if err != nil {
				return err
			}
			b = b[n:]
		}
	}
	if entries > 0 {
		desc.Entries = d.eptrs[start:len(d.eptrs):len(d.eptrs)]
	}
	return nil
}

func (d *decoder) decodeEntry(b []byte, e *commonv3.RateLimitDescriptor_Entry) error {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return errTruncated
		}
		b = b[n:]
		var err error
		switch {
		case num == entryKey && typ == protowire.BytesType:
			e.Key, n, err = d.stringField(b)
		case num == entryValue && typ == protowire.BytesType:
			e.Value, n, err = d.stringField(b)
		default:
			n, err = skipField(num, typ, b)
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// stringField reads a string field's value at the start of b, which must be
// UTF-8 as proto.Unmarshal requires, and returns the bytes it read.
func (d *decoder) stringField(b []byte) (string, int, error) {
	s, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return "", 0, errTruncated
	}
	if !utf8.Valid(s) {
		return "", 0, errUTF8
	}
	return d.str(s), n, nil
}

// skipField reads past a field's value (one not decoded here, or of the
// wrong wire type: proto.Unmarshal keeps those as unknown) and returns the
// bytes it read.
func skipField(num protowire.Number, typ protowire.Type, b []byte) (int, error) {
	n := protowire.ConsumeFieldValue(num, typ, b)
	if n < 0 {
		return 0, errTruncated
	}
	return n, nil
}

// merge reads a length-delimited message field at the start of b into m, by
// the protobuf runtime, merging as it does (the fields given this way are
// rare), and returns the bytes it read.
func merge(b []byte, m proto.Message) (int, error) {
	v, n := protowire.ConsumeBytes(b)
	if n < 0 {
		return 0, errTruncated
	}
	return n, proto.UnmarshalOptions{Merge: true, DiscardUnknown: true}.Unmarshal(v, m)
}

// count is how many descriptors and entries b holds, read from the tags alone;
// on a malformed b it stops early (decoding then fails, or the slabs double).
func count(b []byte) (descs, ents int) {
	for len(b) > 0 {
		num, typ, n := consumeTag(b)
		if n < 0 {
			return
		}
		b = b[n:]
		if num == reqDescriptors && typ == protowire.BytesType {
			m, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return
			}
			descs++
			for len(m) > 0 {
				num, typ, k := consumeTag(m)
				if k < 0 {
					break
				}
				m = m[k:]
				if k = protowire.ConsumeFieldValue(num, typ, m); k < 0 {
					break
				}
				if num == descEntries && typ == protowire.BytesType {
					ents++
				}
				m = m[k:]
			}
			b = b[n:]
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return
		}
		b = b[n:]
	}
	return
}

// consumeTag is protowire.ConsumeTag refusing field numbers past the largest
// valid one, as proto.Unmarshal does.
func consumeTag(b []byte) (protowire.Number, protowire.Type, int) {
	num, typ, n := protowire.ConsumeTag(b)
	if n >= 0 && num > protowire.MaxValidNumber {
		return 0, 0, -1
	}
	return num, typ, n
}

// arenaChunk is the smallest arena chunk: a request's strings, as a rule.
const arenaChunk = 256

// str is s as a string: pointing into the input when it is the block's own
// copy, else copied into the arena.
func (d *decoder) str(s []byte) string {
	if len(s) == 0 {
		return ""
	}
	if !d.alias {
		if cap(d.arena)-len(d.arena) < len(s) {
			d.arena = make([]byte, 0, max(len(s), arenaChunk))
		}
		start := len(d.arena)
		d.arena = append(d.arena, s...)
		s = d.arena[start:]
	}
	return unsafe.String(&s[0], len(s))
}
