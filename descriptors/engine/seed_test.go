package engine

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// keyHash depends on the seed and the bytes alone: another process computes
// the same hashes, or a restarted daemon would restore its buckets under
// keys no request maps to.
func TestKeyHashIsStable(t *testing.T) {
	golden := map[string]uint64{}
	for _, s := range []string{"", "a", "ab", "abc", "abcd", "10.0.0.1", "0123456789abcdef", "0123456789abcdefg", strings.Repeat("x", 100)} {
		golden[s] = keyHash(0x0123456789abcdef, s)
	}
	// The same in another process: no per-process state leaks in.
	if os.Getenv("KEYHASH_CHILD") == "1" {
		for s, h := range golden {
			fmt.Printf("%q %d\n", s, h)
		}
		os.Exit(0)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestKeyHashIsStable$")
	cmd.Env = append(os.Environ(), "KEYHASH_CHILD=1")
	out, err := cmd.Output()
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		i := strings.LastIndexByte(line, ' ')
		s, err := strconv.Unquote(line[:i])
		if err != nil {
			continue
		}
		h, _ := strconv.ParseUint(line[i+1:], 10, 64)
		if golden[s] != h {
			t.Errorf("keyHash(%q) is %x in one process and %x in another", s, golden[s], h)
		}
		seen++
	}
	if seen != len(golden) {
		t.Fatalf("the child process printed %d hashes, want %d:\n%s", seen, len(golden), out)
	}
}

// keyHash spreads: every input bit flips about half the output bits, and
// two seeds give unrelated hashes.
func TestKeyHashAvalanche(t *testing.T) {
	for _, n := range []int{1, 3, 4, 7, 8, 12, 16, 17, 40} {
		base := []byte(strings.Repeat("k", n))
		h0 := keyHash(42, string(base))
		var worst, total float64
		cases := 0
		for i := 0; i < n*8; i++ {
			b := append([]byte(nil), base...)
			b[i/8] ^= 1 << (i % 8)
			d := float64(bits.OnesCount64(h0 ^ keyHash(42, string(b))))
			total += d
			cases++
			worst = max(worst, abs(d-32))
		}
		if mean := total / float64(cases); mean < 24 || mean > 40 || worst > 26 {
			t.Errorf("length %d: flipping one bit flips %.1f output bits on average (worst %v from 32)", n, mean, worst)
		}
		if bits.OnesCount64(h0^keyHash(43, string(base))) < 12 {
			t.Errorf("length %d: two seeds give close hashes", n)
		}
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}

// An engine given a saved seed keys its buckets as the one that saved it.
func TestEngineSeedRestored(t *testing.T) {
	set := mustParse(t, "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	a := newEngine(t, set, nil, Options{})
	b := newEngine(t, set, nil, Options{})
	entries := desc("ip=10.0.0.1").Entries
	r := set.Match("d", entries)
	key := func(e *Engine) uint64 { return e.ruleKey(&e.cur.Load().rules[r.ID()], entries) }
	ka, kb := key(a), key(b)
	if ka == kb {
		t.Fatal("two engines share a seed")
	}
	c := newEngine(t, set, nil, Options{Seed: a.Seed()})
	if kc := key(c); kc != ka || c.Seed() != a.Seed() {
		t.Fatalf("given the seed: key %x, want %x", kc, ka)
	}
	if b.Seed() == 0 {
		t.Fatal("an engine keys with seed 0")
	}
}

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
