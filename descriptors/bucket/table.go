package bucket

// table holds one shard's buckets: an open-addressing hash table of entries
// keyed by their 64-bit key, probed linearly, with backward-shift deletion (no
// tombstones). It replaces a Go map because a decision on an existing bucket
// is a read-modify-write, and a map can only copy a value out and back in: two
// hashes and two probes where one will do. Slots hold no pointers, so the
// garbage collector never scans them, as with the map before.
//
// Keys are already hashes, but every key of a shard shares its low 8 bits
// (the shard is key % shardCount), so the home slot comes from the high bits of
// a multiplicative mix. Key 0 marks an empty slot; the key 0 itself is stored
// as zeroKey, so the two share a bucket, as any two colliding keys do (which
// can only make a limit tighter). Not safe for concurrent use: the shard's
// lock guards it.
type table struct {
	slots []slot // a power of two long, or nil
	n     int
	shift uint // 64 - log2(len(slots))
}

type slot struct {
	key uint64 // 0: empty
	e   entry
}

// zeroKey stands for the key 0. It is 0 modulo shardCount, so it lives in key
// 0's shard: a bucket exported under it is restored where key 0 finds it.
const zeroKey = 0x9e3779b97f4a7c00

// minSlots is a table's first size.
const minSlots = 8

func fixKey(k uint64) uint64 {
	if k == 0 {
		return zeroKey
	}
	return k
}

func (t *table) home(k uint64) int { return int((k * 0x9e3779b97f4a7c15) >> t.shift) }

// len is the number of entries.
func (t *table) len() int { return t.n }

// get returns the entry at k, to read or change in place until the next put
// or delete; nil when there is none.
func (t *table) get(k uint64) *entry {
	if t.n == 0 {
		return nil
	}
	k = fixKey(k)
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == k {
			return &s.e
		}
		if s.key == 0 {
			return nil
		}
	}
}

// put sets the entry at k, adding it when missing.
func (t *table) put(k uint64, e entry) {
	if (t.n+1)*4 > len(t.slots)*3 {
		t.grow()
	}
	k = fixKey(k)
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		s := &t.slots[i]
		if s.key == k {
			s.e = e
			return
		}
		if s.key == 0 {
			s.key, s.e = k, e
			t.n++
			return
		}
	}
}

// grow doubles the slots (to minSlots from none) and places every entry again.
func (t *table) grow() {
	old := t.slots
	size := max(2*len(old), minSlots)
	t.slots = make([]slot, size)
	t.shift = 64
	for s := size; s > 1; s >>= 1 {
		t.shift--
	}
	mask := size - 1
	for _, s := range old {
		if s.key == 0 {
			continue
		}
		i := t.home(s.key)
		for t.slots[i].key != 0 {
			i = (i + 1) & mask
		}
		t.slots[i] = s
	}
}

// delete removes the entry at k; it reports whether there was one.
func (t *table) delete(k uint64) bool {
	if t.n == 0 {
		return false
	}
	k = fixKey(k)
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		switch t.slots[i].key {
		case k:
			t.removeAt(i)
			return true
		case 0:
			return false
		}
	}
}

// removeAt empties slot i and shifts back the entries after it that probed
// past it, so every entry stays reachable from its home without tombstones.
func (t *table) removeAt(i int) {
	t.n--
	mask := len(t.slots) - 1
	hole := i
	for j := (i + 1) & mask; t.slots[j].key != 0; j = (j + 1) & mask {
		// The entry at j may fill the hole unless its home lies cyclically
		// in (hole, j]: then it would sit before its home.
		h := t.home(t.slots[j].key)
		if (j-h)&mask >= (j-hole)&mask {
			t.slots[hole] = t.slots[j]
			hole = j
		}
	}
	t.slots[hole] = slot{}
}

// all calls f with every entry, which f may change in place but must not add
// or delete; it stops when f returns false.
func (t *table) all(f func(k uint64, e *entry) bool) {
	for i := range t.slots {
		if s := &t.slots[i]; s.key != 0 && !f(s.key, &s.e) {
			return
		}
	}
}

// sweep deletes every entry drop reports true for, and returns how many. drop
// may see an entry twice (one shifted back over the end of the slots); it must
// decide the same way both times.
func (t *table) sweep(drop func(k uint64, e *entry) bool) int {
	n := 0
	for i := 0; i < len(t.slots); {
		s := &t.slots[i]
		if s.key != 0 && drop(s.key, &s.e) {
			t.removeAt(i)
			n++
			continue // slot i now holds an entry shifted back, or nothing
		}
		i++
	}
	return n
}
