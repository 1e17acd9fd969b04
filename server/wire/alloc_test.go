package wire

import (
	"bytes"
	"runtime"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
)

// allocated is the bytes f allocates.
func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

// hostile requests of 1 MiB (the server's MaxRecvMsgSize).
func hostileRequests() map[string][]byte {
	const size = 1 << 20
	empties := bytes.Repeat([]byte{0x12, 0x00}, size/2)
	// One descriptor that fails at once (invalid UTF-8 in its first entry),
	// then 1 MiB of empty descriptors that count() sizes slabs for.
	bad := field(nil, reqDescriptors, field(nil, descEntries, field(nil, entryValue, []byte{0xff})))
	failFirst := append(bad, bytes.Repeat([]byte{0x12, 0x00}, (size-len(bad))/2)...)
	// The same with entries: one descriptor of 1 MiB of empty entries whose
	// first is invalid.
	body := append(field(nil, descEntries, field(nil, entryValue, []byte{0xff})), bytes.Repeat([]byte{0x0a, 0x00}, size/2-8)...)
	entsFail := field(nil, reqDescriptors, body)
	return map[string][]byte{
		"empty descriptors":                       empties,
		"invalid first descriptor, then empties":  failFirst,
		"invalid first entry, then empty entries": entsFail,
	}
}

// TestHostileAllocation: decoding a hostile 1 MiB request must not
// allocate much more than proto.Unmarshal does for the same bytes.
func TestHostileAllocation(t *testing.T) {
	for name, raw := range hostileRequests() {
		var werr, perr error
		w := allocated(func() { werr = DecodeRequest(raw, new(rlsv3.RateLimitRequest)) })
		p := allocated(func() { perr = proto.Unmarshal(raw, new(rlsv3.RateLimitRequest)) })
		t.Logf("%s (%d bytes): wire %d bytes (err %v), proto %d bytes (err %v), ratio %.1f", name, len(raw), w, werr, p, perr, float64(w)/float64(max(p, 1)))
		if w > 4*p+(1<<20) {
			t.Errorf("%s: DecodeRequest allocates %d bytes, proto.Unmarshal %d", name, w, p)
		}
	}
}
