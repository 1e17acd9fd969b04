package descriptors

import (
	"hash/maphash"
	"unsafe"
)

// The keys of the buckets are hashed with a random per-process seed, so an
// outsider cannot aim two keys at one bucket. A snapshot of the buckets
// (--state-file) is only worth restoring if the restarted process hashes the
// same keys to the same buckets, so the seed is saved with the snapshot and
// restored with it. hash/maphash has no way to export or import a seed; its
// Seed is one non-zero uint64, which seedBits and seedOf read and write. The
// layout is checked by TestSeedRoundTrip: a Go release that changes it
// fails that test rather than restoring buckets under the wrong keys.

// seedBits is s as 64 bits.
func seedBits(s maphash.Seed) uint64 {
	return *(*uint64)(unsafe.Pointer(&s))
}

// seedOf is the seed whose bits are b; ok is false for 0, which maphash
// reserves for an uninitialised seed.
func seedOf(b uint64) (s maphash.Seed, ok bool) {
	if b == 0 || unsafe.Sizeof(s) != unsafe.Sizeof(b) {
		return s, false
	}
	*(*uint64)(unsafe.Pointer(&s)) = b
	return s, true
}

// Seed is the engine's key seed, for a snapshot.
func (e *Engine) Seed() uint64 { return seedBits(e.seed) }

// SetSeed makes the engine hash keys with the seed a snapshot saved, so its
// buckets can be restored. It must be called before the engine serves and
// before any bucket exists: a bucket made under the old seed would never be
// found again. It reports false, changing nothing, for an invalid seed.
func (e *Engine) SetSeed(bits uint64) bool {
	s, ok := seedOf(bits)
	if !ok {
		return false
	}
	e.swapMu.Lock()
	defer e.swapMu.Unlock()
	e.seed = s
	e.swap(e.cur.Load().set)
	return true
}
