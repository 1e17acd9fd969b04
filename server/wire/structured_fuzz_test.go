package wire

import (
	"bytes"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// build turns a script into a request's bytes: structured enough to reach
// many descriptors and entries, with stray fields, wrong types and repeats.
func build(script []byte) []byte {
	var out, desc, ent []byte
	flushEnt := func() {
		if ent != nil {
			desc = field(desc, descEntries, ent)
			ent = nil
		}
	}
	flushDesc := func() {
		flushEnt()
		if desc != nil {
			out = field(out, reqDescriptors, desc)
			desc = nil
		}
	}
	for i := 0; i < len(script); i++ {
		c := script[i]
		arg := byte(0)
		if i+1 < len(script) {
			arg = script[i+1]
		}
		switch c % 16 {
		case 0:
			flushDesc()
			desc = []byte{}
		case 1:
			flushEnt()
			ent = []byte{}
			if desc == nil {
				desc = []byte{}
			}
		case 2:
			ent = field(ent, entryKey, bytes.Repeat([]byte{'k'}, int(arg%5)))
			i++
		case 3:
			ent = field(ent, entryValue, []byte{arg})
			i++
		case 4:
			out = field(out, reqDomain, []byte{'d', arg})
			i++
		case 5:
			out = protowire.AppendVarint(tag(out, reqHitsAddend, protowire.VarintType), uint64(arg)<<30)
			i++
		case 6:
			desc = field(desc, descLimit, protowire.AppendVarint(tag(nil, protowire.Number(arg%4+1), protowire.VarintType), uint64(arg)))
			i++
		case 7:
			desc = field(desc, descHitsAddend, protowire.AppendVarint(tag(nil, 1, protowire.VarintType), uint64(arg)))
			i++
		case 8:
			desc = protowire.AppendVarint(tag(desc, descIsNegativeHits, protowire.VarintType), uint64(arg%3))
			i++
		case 9:
			// wrong wire type for a known number, at some level
			n := protowire.Number(arg%4 + 1)
			switch arg % 3 {
			case 0:
				out = protowire.AppendVarint(tag(out, n, protowire.VarintType), 1)
			case 1:
				desc = protowire.AppendFixed32(tag(desc, n, protowire.Fixed32Type), 1)
			case 2:
				ent = protowire.AppendFixed64(tag(ent, n, protowire.Fixed64Type), 1)
			}
			i++
		case 10:
			out = tag(tag(out, 50, protowire.StartGroupType), 50, protowire.EndGroupType)
		case 11:
			flushDesc()
		case 12:
			// raw byte into the current level
			switch {
			case ent != nil:
				ent = append(ent, arg)
			case desc != nil:
				desc = append(desc, arg)
			default:
				out = append(out, arg)
			}
			i++
		default:
			ent = field(ent, entryValue, []byte("v"))
		}
	}
	flushDesc()
	return out
}

func FuzzDecodeStructured(f *testing.F) {
	f.Add([]byte{0, 1, 2, 1, 3, 'a', 1, 3, 'b', 1, 0, 1, 1, 1, 4, 'x'}, byte(3))
	f.Add([]byte{0, 1, 1, 1, 6, 1, 6, 2, 0, 0, 0, 1, 1, 1, 1}, byte(1))
	f.Fuzz(func(t *testing.T, script []byte, split byte) {
		b := build(script)
		checkDecode(t, b)
		// Through the codec, split over buffers, then the buffers overwritten
		// and a second request decoded: the first must not change.
		want := new(rlsv3.RateLimitRequest)
		if proto.Unmarshal(b, want) != nil {
			return
		}
		stripUnknown(want.ProtoReflect())
		raw := bytes.Clone(b)
		var data mem.BufferSlice
		k := int(split%13) + 1
		for rest := raw; len(rest) > 0; {
			n := min(k, len(rest))
			data = append(data, mem.SliceBuffer(rest[:n]))
			rest = rest[n:]
		}
		c := NewCodec()
		got := new(rlsv3.RateLimitRequest)
		if err := c.Unmarshal(data, got); err != nil {
			t.Fatalf("codec: %v", err)
		}
		for i := range raw {
			raw[i] = 0xAA
		}
		other := new(rlsv3.RateLimitRequest)
		_ = c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(build(append([]byte{4, 'z'}, script...)))}, other)
		if !proto.Equal(got, want) {
			t.Fatalf("input %x: after reuse\n got %v\nwant %v", b, got, want)
		}
	})
}
