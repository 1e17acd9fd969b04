package descriptors

import (
	"hash/maphash"
	"testing"
)

// The seed survives a round trip through its bits: the same strings hash the
// same under the restored seed, and differently under another.
func TestSeedRoundTrip(t *testing.T) {
	s := maphash.MakeSeed()
	b := seedBits(s)
	r, ok := seedOf(b)
	if !ok || b == 0 {
		t.Fatalf("seed bits %x, ok %v", b, ok)
	}
	for _, v := range []string{"", "10.0.0.1", "a much longer value than eight bytes, to cover the bulk path"} {
		if maphash.String(s, v) != maphash.String(r, v) {
			t.Fatalf("%q hashes differently under the restored seed: maphash.Seed's layout changed", v)
		}
		if maphash.String(maphash.MakeSeed(), v) == maphash.String(s, v) {
			t.Fatalf("%q hashes the same under a fresh seed", v)
		}
	}
	if _, ok := seedOf(0); ok {
		t.Fatal("seed 0 accepted")
	}
}

// An engine given a saved seed keys its buckets as the one that saved it.
func TestEngineSeedRestored(t *testing.T) {
	set := mustParse(t, "domain: d\ndescriptors:\n  - key: ip\n    rate_limit: {unit: second, requests_per_unit: 1}\n")
	a := NewEngine(set, 1, nil)
	b := NewEngine(set, 1, nil)
	entries := desc("ip=10.0.0.1").Entries
	r := set.Match("d", entries)
	ka, kb := a.ruleKey(a.cur.Load(), r, entries), b.ruleKey(b.cur.Load(), r, entries)
	if ka == kb {
		t.Fatal("two engines share a seed")
	}
	if !b.SetSeed(a.Seed()) {
		t.Fatal("SetSeed refused a valid seed")
	}
	if kb = b.ruleKey(b.cur.Load(), r, entries); kb != ka {
		t.Fatalf("after SetSeed: key %x, want %x", kb, ka)
	}
}
