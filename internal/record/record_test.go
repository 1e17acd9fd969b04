package record

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

var errTest = errors.New("test: bad record")

var testFormat = &Format{Magic: "TST", Versions: []byte{2, 1}, Err: errTest, What: "test record",
	Corrupt: "checksum mismatch", MinSize: 9, MaxSize: 64}

// frame is body framed at version v.
func frame(v byte, body ...byte) []byte {
	b := append([]byte(testFormat.Magic), v)
	return Seal(append(b, body...), 0)
}

func TestOpen(t *testing.T) {
	good := frame(2, 1, 2, 3)
	corrupt := bytes.Clone(good)
	corrupt[5] ^= 1
	badSum := bytes.Clone(good)
	badSum[len(badSum)-1] ^= 0x80
	for _, c := range []struct {
		name    string
		b       []byte
		version byte
		body    []byte
		err     string // "" when it opens
	}{
		{"good", good, 2, []byte{1, 2, 3}, ""},
		{"older version read", frame(1, 9, 9, 9), 1, []byte{9, 9, 9}, ""},
		{"empty", nil, 0, nil, "not a sharelimit test record"},
		{"shorter than MinSize", frame(2), 0, nil, "not a sharelimit test record"},
		{"header only", []byte("TST\x02"), 0, nil, "not a sharelimit test record"},
		{"foreign magic", append([]byte("XYZ"), good[3:]...), 0, nil, "not a sharelimit test record"},
		{"truncated", good[:len(good)-1], 0, nil, "checksum mismatch"},
		{"bit flipped", corrupt, 0, nil, "checksum mismatch"},
		{"checksum flipped", badSum, 0, nil, "checksum mismatch"},
		{"future version", frame(3, 1, 2, 3), 0, nil, "version 3, this build reads 2"},
		{"version 0", frame(0, 1, 2, 3), 0, nil, "version 0, this build reads 2"},
		{"oversized", frame(2, make([]byte, 60)...), 0, nil, "68 bytes, more than 64"},
	} {
		v, r, err := testFormat.Open(c.b)
		if c.err != "" {
			if !errors.Is(err, errTest) || err.Error() != "test: bad record: "+c.err || r != nil {
				t.Errorf("%s: %v, want %q", c.name, err, c.err)
			}
			continue
		}
		if err != nil || v != c.version || !bytes.Equal(r.Rest(), c.body) {
			t.Errorf("%s: version %d, %v", c.name, v, err)
		}
	}
	// Oversized is checked first, magic or not.
	if _, _, err := testFormat.Open(make([]byte, 65)); err == nil || !strings.Contains(err.Error(), "65 bytes") {
		t.Errorf("oversized garbage: %v", err)
	}
	// No MaxSize: no bound.
	f := *testFormat
	f.MaxSize = 0
	if _, _, err := f.Open(frame(2, make([]byte, 1000)...)); err != nil {
		t.Errorf("unbounded: %v", err)
	}
}

func TestAppendSeal(t *testing.T) {
	b := testFormat.Append([]byte("prefix"))
	b = append(b, 7, 8)
	b = Seal(b, len("prefix"))
	if want := frame(2, 7, 8); !bytes.Equal(b[len("prefix"):], want) {
		t.Fatalf("%x, want %x", b, want)
	}
}

func TestReader(t *testing.T) {
	type op func(r *Reader) any
	uvarint := func(r *Reader) any { return r.Uvarint() }
	varint := func(r *Reader) any { return r.Varint() }
	u16 := func(r *Reader) any { return r.Uint16("short u16") }
	u32 := func(r *Reader) any { return r.Uint32("short u32") }
	u64 := func(r *Reader) any { return r.Uint64("short u64") }
	count := func(r *Reader) any { return r.Count(5, "%d things, more than %d") }
	take2 := func(r *Reader) any { return string(r.Take(2, "short take")) }
	for _, c := range []struct {
		name string
		b    []byte
		ops  []op
		want []any
		err  string // of Close; "" for none
	}{
		{"uvarints", []byte{0, 0x7f, 0x80, 0x01}, []op{uvarint, uvarint, uvarint}, []any{uint64(0), uint64(127), uint64(128)}, ""},
		{"varints", []byte{1, 2}, []op{varint, varint}, []any{int64(-1), int64(1)}, ""},
		{"fixed", []byte{1, 0, 2, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0}, []op{u16, u32, u64}, []any{uint16(1), uint32(2), uint64(3)}, ""},
		{"take", []byte("hi"), []op{take2}, []any{"hi"}, ""},
		{"count at the limit", []byte{5}, []op{count}, []any{5}, ""},
		{"count over", []byte{6, 1}, []op{count, uvarint}, []any{0, uint64(0)}, "6 things, more than 5"},
		{"overlong uvarint", []byte{0x80, 0x00}, []op{uvarint}, []any{uint64(0)}, "truncated, overlong or padded integer"},
		{"overlong varint", []byte{0x81, 0x00}, []op{varint}, []any{int64(0)}, "truncated, overlong or padded integer"},
		{"truncated uvarint", []byte{0x80}, []op{uvarint}, []any{uint64(0)}, "truncated, overlong or padded integer"},
		{"uvarint past 64 bits", bytes.Repeat([]byte{0xff}, 11), []op{uvarint}, []any{uint64(0)}, "truncated, overlong or padded integer"},
		{"empty", nil, []op{uvarint}, []any{uint64(0)}, "truncated, overlong or padded integer"},
		{"short u16", []byte{1}, []op{u16}, []any{uint16(0)}, "short u16"},
		{"short u32", []byte{1, 2, 3}, []op{u32}, []any{uint32(0)}, "short u32"},
		{"short u64", []byte{1, 2, 3, 4, 5, 6, 7}, []op{u64}, []any{uint64(0)}, "short u64"},
		{"short take", []byte{1}, []op{take2}, []any{""}, "short take"},
		// The first error sticks, and every read after it is zero.
		{"sticky", []byte{0x80, 0, 2, 3, 4, 5, 6, 7, 8}, []op{uvarint, u64, take2, varint}, []any{uint64(0), uint64(0), "", int64(0)}, "truncated, overlong or padded integer"},
		{"trailing bytes", []byte{1, 2, 3}, []op{uvarint}, []any{uint64(1)}, "2 trailing bytes"},
	} {
		r := NewReader(c.b, errTest)
		for i, o := range c.ops {
			if got := o(r); got != c.want[i] {
				t.Errorf("%s: read %d = %v (%T), want %v (%T)", c.name, i, got, got, c.want[i], c.want[i])
			}
		}
		err := r.Close()
		if c.err == "" && err != nil || c.err != "" && (!errors.Is(err, errTest) || err.Error() != "test: bad record: "+c.err) {
			t.Errorf("%s: Close = %v, want %q", c.name, err, c.err)
		}
	}
}

func TestTrailerAndRest(t *testing.T) {
	r := NewReader([]byte{1, 2, 3, 4, 5}, errTest)
	if tr := r.Trailer(2); !bytes.Equal(tr, []byte{4, 5}) || r.Len() != 3 {
		t.Fatalf("trailer %v, %d left", tr, r.Len())
	}
	if rest := r.Rest(); !bytes.Equal(rest, []byte{1, 2, 3}) || r.Len() != 0 || r.Close() != nil {
		t.Fatalf("rest %v, %d left, %v", rest, r.Len(), r.Err())
	}
	r = NewReader([]byte{1}, errTest)
	if tr := r.Trailer(2); tr != nil || !errors.Is(r.Err(), errTest) {
		t.Fatalf("a trailer longer than the body: %v, %v", tr, r.Err())
	}
}

type failWriter struct{ n int }

func (w *failWriter) Write(p []byte) (int, error) {
	if w.n -= len(p); w.n < 0 {
		return 0, errors.New("disk full")
	}
	return len(p), nil
}

func TestWriter(t *testing.T) {
	var buf bytes.Buffer
	w := testFormat.NewWriter(&buf)
	w.Write([]byte{1, 2})
	w.Write([]byte{3})
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if want := frame(2, 1, 2, 3); !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("%x, want %x", buf.Bytes(), want)
	}
	// A write that fails sticks: later writes are dropped, Close reports it.
	w = testFormat.NewWriter(&failWriter{n: 10})
	big := make([]byte, 1<<17) // past the buffer: reaches the writer
	if err := w.Write(big); err == nil {
		t.Fatal("a failed write succeeded")
	}
	if err := w.Write([]byte{1}); err == nil || w.Err() == nil || w.Close() == nil {
		t.Fatal("the error did not stick")
	}
}

// FuzzOpen: no input crashes Open or the reader, every error wraps the
// format's, and whatever opens is framed again to the same bytes.
func FuzzOpen(f *testing.F) {
	f.Add(frame(2, 1, 2, 3))
	f.Add(frame(1, 0x80, 0x80, 0x01, 0xff, 0xff))
	f.Add([]byte("TST"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		// Half the inputs get a valid checksum, to reach past it.
		if len(b) > 4 && b[0]&1 == 1 {
			b = Seal(bytes.Clone(b[:len(b)-4]), 0)
		}
		v, r, err := testFormat.Open(b)
		if err != nil {
			if !errors.Is(err, errTest) || r != nil {
				t.Fatalf("Open(%x) = %v, %v", b, r, err)
			}
			return
		}
		body := append([]byte(nil), b[len(testFormat.Magic)+1:len(b)-TrailerSize]...)
		if again := Seal(append(append([]byte(testFormat.Magic), v), body...), 0); !bytes.Equal(again, b) {
			t.Fatalf("reframed to %x, from %x", again, b)
		}
		// Read the body as its bytes say, until the first error.
		for r.Len() > 0 && r.Err() == nil {
			switch r.Take(1, "op")[0] % 7 {
			case 0:
				r.Uvarint()
			case 1:
				r.Varint()
			case 2:
				r.Uint16("u16")
			case 3:
				r.Uint32("u32")
			case 4:
				r.Uint64("u64")
			case 5:
				r.Take(r.Count(8, "%d, more than %d"), "take")
			case 6:
				r.Trailer(3)
			}
		}
		if err := r.Close(); err != nil && (!errors.Is(err, errTest) || r.Len() != 0) {
			t.Fatalf("Close = %v, %d bytes left", err, r.Len())
		}
	})
}
