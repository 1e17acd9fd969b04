package engine

import (
	"encoding/binary"
	"math/rand/v2"
	"unsafe"
)

// The keys of the buckets are hashed with a random per-process seed, so an
// outsider cannot aim two keys at one bucket. A snapshot of the buckets
// (--state-file) is only worth restoring if the restarted process hashes the
// same keys to the same buckets, so the seed is saved with the snapshot and
// restored with it. hash/maphash cannot serve: its hashes differ between
// processes even under one seed (the runtime keys them per process). So the
// keys are hashed here, by keyHash: a multiply-and-fold string hash in the
// manner of wyhash, keyed by the 64-bit seed, whose results depend on the
// seed and the bytes alone.

// Multipliers of keyHash: odd 64-bit constants with well-spread bits.
const (
	k0 = 0xa0761d6478bd642f
	k1 = 0xe7037ed1a0b428db
	k2 = 0x8ebc6af09c88c6e3
)

// newSeed is a random seed, never 0.
func newSeed() uint64 {
	for {
		if s := rand.Uint64(); s != 0 {
			return s
		}
	}
}

// keyHash hashes s under seed. It reads s eight bytes at a time, 16 per
// round, and its last (overlapping) eight, so a short string costs one or
// two multiplies.
func keyHash(seed uint64, s string) uint64 {
	n := len(s)
	b := unsafe.Slice(unsafe.StringData(s), n) // read only
	h := seed ^ k0
	// Both operands of every multiply carry the seed: an operand a request
	// could zero (8 bytes chosen against the constants alone) would wipe
	// the state, and the seed with it.
	for len(b) > 16 {
		h = mix(binary.LittleEndian.Uint64(b)^k1^seed, binary.LittleEndian.Uint64(b[8:])^h)
		b = b[16:]
	}
	var lo, hi uint64
	switch m := len(b); {
	case m >= 8:
		lo, hi = binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[m-8:])
	case m >= 4:
		lo, hi = uint64(binary.LittleEndian.Uint32(b)), uint64(binary.LittleEndian.Uint32(b[m-4:]))
	case m > 0:
		lo = uint64(b[0])<<16 | uint64(b[m>>1])<<8 | uint64(b[m-1])
	}
	return mix(k2^uint64(n)^seed, mix(lo^k1^seed, hi^h))
}

// Seed is the engine's key seed, for a snapshot; never 0. A new engine given
// it (Options.Seed) hashes keys as this one does, so it can restore this
// one's buckets.
func (e *Engine) Seed() uint64 { return e.seed }
