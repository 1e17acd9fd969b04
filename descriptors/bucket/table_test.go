package bucket

import (
	"math/rand/v2"
	"testing"
	"unsafe"
)

// TestTableModel runs random puts, gets, deletes and sweeps on a table and on
// a Go map side by side. The keys are drawn from a small set that shares its
// low 8 bits, as a shard's keys do, and includes 0 and zeroKey (which share a
// bucket), so probe chains are long, wrap around the end and are cut by
// deletions.
func TestTableModel(t *testing.T) {
	for seed := range uint64(40) {
		r := rand.New(rand.NewPCG(seed, 7))
		keys := []uint64{0, zeroKey}
		for range 60 {
			keys = append(keys, r.Uint64()<<8|0x2a)
		}
		var tb table
		model := map[uint64]entry{}
		for op := range 4000 {
			k := keys[r.IntN(len(keys))]
			mk := fixKey(k)
			switch r.IntN(10) {
			case 0, 1, 2, 3:
				e := entry{State: State{Fill: r.Float64(), Last: int64(op)}}
				tb.put(k, e)
				model[mk] = e
			case 4, 5:
				_, had := model[mk]
				if got := tb.delete(k); got != had {
					t.Fatalf("seed %d op %d: delete(%x) = %v, model had it: %v", seed, op, k, got, had)
				}
				delete(model, mk)
			case 6:
				cut := r.Float64()
				seen := map[uint64]bool{}
				n := tb.sweep(func(k uint64, e *entry) bool {
					seen[k] = true
					return e.Fill < cut
				})
				want := 0
				for mk, e := range model {
					if e.Fill < cut {
						delete(model, mk)
						want++
					}
				}
				if n != want {
					t.Fatalf("seed %d op %d: sweep dropped %d, want %d", seed, op, n, want)
				}
				if len(seen) != len(model)+want {
					t.Fatalf("seed %d op %d: sweep saw %d keys of %d", seed, op, len(seen), len(model)+want)
				}
			default:
				e := tb.get(k)
				m, ok := model[mk]
				if (e != nil) != ok || (ok && *e != m) {
					t.Fatalf("seed %d op %d: get(%x) = %v, model %v %v", seed, op, k, e, m, ok)
				}
				if e != nil {
					e.Fill += 1 // changed in place
					model[mk] = *e
				}
			}
			if tb.len() != len(model) {
				t.Fatalf("seed %d op %d: %d entries, model %d", seed, op, tb.len(), len(model))
			}
		}
		n := 0
		tb.all(func(k uint64, e *entry) bool {
			if m, ok := model[k]; !ok || m != *e {
				t.Fatalf("seed %d: all yields %x %v, model %v %v", seed, k, *e, m, ok)
			}
			n++
			return true
		})
		if n != len(model) {
			t.Fatalf("seed %d: all yields %d of %d", seed, n, len(model))
		}
	}
}

// TestTableSlotSize: a slot is pointer-free, so the garbage collector never
// scans the slots, and 40 bytes: an entry and its key.
func TestTableSlotSize(t *testing.T) {
	if s := unsafe.Sizeof(slot{}); s != 40 {
		t.Fatalf("a slot is %d bytes, want 40", s)
	}
}

// TestShardPadding keeps a shard one cache line long.
func TestShardPadding(t *testing.T) {
	if s := unsafe.Sizeof(shard{}); s != 64 {
		t.Fatalf("a shard is %d bytes, want 64", s)
	}
}
