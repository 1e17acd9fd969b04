package engine

import (
	"encoding/binary"
	"testing"
)

// No 8 bytes chosen against keyHash's constants alone make it forget the
// seed: with mix multiplying (a^k0)·(b^k1), a block whose first 8 bytes
// were k0^k1 once zeroed the state whatever the seed, and anyone could make
// colliding keys without knowing it.
func TestKeyHashNoSeedFreeCollisions(t *testing.T) {
	var z [8]byte
	binary.LittleEndian.PutUint64(z[:], k0^k1)
	a := string(z[:]) + "AAAAAAAA" // 16 bytes: lo^k1 cancels k0 in mix
	b := string(z[:]) + "BBBBBBBB"
	long1 := "prefix-one-16byt" + string(z[:]) + "XXXXXXXX" + "tail"
	long2 := "another-prefix-!" + string(z[:]) + "YYYYYYYY" + "tail"
	for _, seed := range []uint64{1, 0x0123456789abcdef, 0xdeadbeefcafef00d} {
		if keyHash(seed, a) == keyHash(seed, b) {
			t.Errorf("seed %x: %q and %q collide (%x)", seed, a, b, keyHash(seed, a))
		}
		if keyHash(seed, long1) == keyHash(seed, long2) {
			t.Errorf("seed %x: %q and %q collide", seed, long1, long2)
		}
	}
	if keyHash(1, a) == keyHash(2, a) {
		t.Errorf("the hash of %q does not depend on the seed: %x", a, keyHash(1, a))
	}
}
