package state

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

func sampleHeader() Header {
	return Header{
		Written: time.Unix(1_780_000_000, 123), Seed: 0xdeadbeefcafe,
		Weights: []float64{1, 0.25, 0.5},
		Views: []View{
			{Group: 1, Total: 4, Local: 1, TotalWeight: 4, LocalWeight: 1, Weight: 0.25},
			{Group: 2, Service: "db", Total: 2, Local: 1, TotalWeight: 2, LocalWeight: 1, Weight: 0.5},
		},
	}
}

func sampleBuckets(n int) []bucket.Saved {
	out := make([]bucket.Saved, n)
	for i := range out {
		out[i] = bucket.Saved{Key: uint64(i)*0x9e3779b97f4a7c15 + 1, Fill: float64(float32(i%1000) / 1000), Group: uint16(i % 3), Tag: uint16(i%7 + 1), Rate: 100, Size: float32(i%5 + 1)}
	}
	return out
}

func encode(t testing.TB, h Header, bs []bucket.Saved) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc, err := NewEncoder(&buf, h)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < len(bs); i += 4096 {
		if err := enc.Add(bs[i:min(i+4096, len(bs))]); err != nil {
			t.Fatal(err)
		}
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A million buckets round-trip exactly, at 24 bytes each.
func TestRoundTripMillion(t *testing.T) {
	bs := sampleBuckets(1_000_000)
	b := encode(t, sampleHeader(), bs)
	if max := int64(len(bs))*recordSize + 200; int64(len(b)) > max {
		t.Errorf("%d bytes for 1M buckets, want at most %d", len(b), max)
	}
	s, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	h := sampleHeader()
	if !s.Written.Equal(h.Written) || s.Seed != h.Seed || !reflect.DeepEqual(s.Weights, h.Weights) || !reflect.DeepEqual(s.Views, h.Views) {
		t.Fatalf("header %+v, want %+v", s.Header, h)
	}
	if !reflect.DeepEqual(s.Buckets, bs) {
		t.Fatal("buckets differ after a round trip")
	}
}

// Full buckets are not written: they are the same as none.
func TestEncoderSkipsFull(t *testing.T) {
	s, err := Decode(encode(t, sampleHeader(), []bucket.Saved{{Key: 1, Fill: 1}, {Key: 2, Fill: 0.5, Rate: 1, Size: 1}}))
	if err != nil || len(s.Buckets) != 1 || s.Buckets[0].Key != 2 {
		t.Fatalf("%+v %v", s.Buckets, err)
	}
}

func reseal(b []byte) []byte {
	b = bytes.Clone(b)
	binary.LittleEndian.PutUint32(b[len(b)-4:], crc32.Checksum(b[:len(b)-4], castagnoli))
	return b
}

// Every kind of bad file is refused whole, with ErrFormat.
func TestDecodeRefuses(t *testing.T) {
	good := encode(t, sampleHeader(), sampleBuckets(10))
	flip := func(i int) []byte { b := bytes.Clone(good); b[i] ^= 0x10; return b }
	badFill := encode(t, sampleHeader(), sampleBuckets(1))
	off := len(badFill) - trailerSize - recordSize + 8
	binary.LittleEndian.PutUint32(badFill[off:], 0x7fc00000) // NaN
	badFill = reseal(badFill)
	for name, b := range map[string][]byte{
		"empty":             nil,
		"not ours":          []byte("hello, this is not a snapshot at all, no"),
		"truncated":         good[:len(good)-7],
		"cut mid-record":    good[:len(good)-trailerSize-5],
		"bit flipped":       flip(40),
		"checksum flipped":  flip(len(good) - 1),
		"foreign version":   reseal(append(append([]byte(magic), version+1), good[4:]...)),
		"count disagrees":   reseal(append(good[:len(good)-12:len(good)-12], 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0)),
		"a fill not a fill": badFill,
	} {
		if _, err := Decode(b); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", name, err)
		}
	}
}

// Files: written atomically (no temporary file left), read back; an
// oversized, unreadable or missing file is an error, and a failed write
// leaves the old file as it was.
func TestFiles(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "state")
	bs := sampleBuckets(100)
	write := func(export func(add func([]bucket.Saved) error) error) error {
		_, _, err := WriteFile(path, sampleHeader(), export)
		return err
	}
	if err := write(func(add func([]bucket.Saved) error) error { return add(bs) }); err != nil {
		t.Fatal(err)
	}
	s, err := ReadFile(path, MaxSize(100))
	if err != nil || len(s.Buckets) != 100 {
		t.Fatalf("%d buckets, %v", len(s.Buckets), err)
	}
	if _, err := ReadFile(path, 100); !errors.Is(err, ErrFormat) {
		t.Errorf("oversized: %v", err)
	}
	if _, err := ReadFile(filepath.Join(dir, "missing"), 1<<20); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing: %v", err)
	}
	if _, err := ReadFile(dir, 1<<20); err == nil {
		t.Error("a directory read as a snapshot")
	}
	before, _ := os.ReadFile(path)
	boom := errors.New("boom")
	if err := write(func(add func([]bucket.Saved) error) error { add(bs[:3]); return boom }); !errors.Is(err, boom) {
		t.Fatalf("a failed export: %v", err)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Error("a failed write changed the file")
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("files left behind: %v", entries)
	}
	if err := os.Chmod(path, 0); err == nil && os.Geteuid() != 0 {
		if _, err := ReadFile(path, 1<<20); err == nil {
			t.Error("an unreadable file was read")
		}
	}
}

func BenchmarkWriteRead(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		bs := sampleBuckets(n)
		path := filepath.Join(b.TempDir(), "state")
		b.Run(bname("write", n), func(b *testing.B) {
			for b.Loop() {
				if _, _, err := WriteFile(path, sampleHeader(), func(add func([]bucket.Saved) error) error { return add(bs) }); err != nil {
					b.Fatal(err)
				}
			}
			st, _ := os.Stat(path)
			b.ReportMetric(float64(st.Size())/1e6, "MB")
		})
		b.Run(bname("read", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ReadFile(path, MaxSize(n)); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func bname(op string, n int) string {
	if n >= 1_000_000 {
		return op + "-1M"
	}
	return op + "-100k"
}

// A fill is saved rounded down, never up.
func TestFillRoundsDown(t *testing.T) {
	for _, f := range []float64{1.0 / 3, 0.1, 0.7, 1 - 1e-12, -1.0 / 3} {
		s, err := Decode(encode(t, Header{}, []bucket.Saved{{Key: 1, Fill: f, Rate: 1, Size: 1}}))
		if err != nil {
			t.Fatal(err)
		}
		if len(s.Buckets) == 1 && s.Buckets[0].Fill > f {
			t.Errorf("%v saved as %v", f, s.Buckets[0].Fill)
		}
	}
}
