// Package record is the framing shared by sharelimit's binary records: a
// magic string, a version byte, a body and a CRC-32C trailer, with a
// sticky-error reader and writer for the body.
//
// Why a package of its own: two formats, the state file (package state)
// and the demand reports and parameters in Consul (package demand), cross
// process lifetimes and trust boundaries, so both must frame alike and
// refuse bad bytes alike (wrong magic or version, a bad checksum, too
// short or too long, truncated or overlong integers, trailing bytes). The
// checks are written and fuzzed here once, not once per format.
//
// The frame, little endian:
//
//	magic    Format.Magic             len(Magic) bytes
//	version  one of Format.Versions   1 byte
//	body     the format's own
//	crc      CRC-32C of everything before it, 4 bytes
//
// Every error wraps the format's Err.
//
// It must never hand out a record's body before its frame is checked (Open
// checks the size, magic, checksum and version first), and never know what
// a body holds: each format reads and writes its own through Reader and
// Writer.
package record

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
)

// Castagnoli is the CRC-32C table every record's checksum is computed with.
var Castagnoli = crc32.MakeTable(crc32.Castagnoli)

// TrailerSize is the checksum's bytes.
const TrailerSize = 4

// Format is one record format's framing.
type Format struct {
	Magic    string
	Versions []byte // read; the first is the one written
	Err      error  // every error wraps it
	What     string // the record's name, as "not a sharelimit <What>"
	Corrupt  string // the message of a bad checksum
	MinSize  int    // the shortest record, checksum included
	MaxSize  int    // the longest, 0 for no bound
}

// HeaderSize is the bytes of the magic and the version.
func (f *Format) HeaderSize() int { return len(f.Magic) + 1 }

// Append appends the magic and the version written to b.
func (f *Format) Append(b []byte) []byte {
	return append(append(b, f.Magic...), f.Versions[0])
}

// Seal appends the checksum of b[start:] to b: start is where the record,
// its magic first, begins in b.
func Seal(b []byte, start int) []byte {
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], Castagnoli))
}

// Open checks b's framing, in this order: its size, its magic, its
// checksum and its version. It returns the version and a reader of the
// body, the bytes between the version and the checksum.
func (f *Format) Open(b []byte) (byte, *Reader, error) {
	if f.MaxSize > 0 && len(b) > f.MaxSize {
		return 0, nil, fmt.Errorf("%w: %d bytes, more than %d", f.Err, len(b), f.MaxSize)
	}
	if len(b) < max(f.MinSize, f.HeaderSize()+TrailerSize) || string(b[:len(f.Magic)]) != f.Magic {
		return 0, nil, fmt.Errorf("%w: not a sharelimit %s", f.Err, f.What)
	}
	body, sum := b[:len(b)-TrailerSize], binary.LittleEndian.Uint32(b[len(b)-TrailerSize:])
	if crc32.Checksum(body, Castagnoli) != sum {
		return 0, nil, fmt.Errorf("%w: %s", f.Err, f.Corrupt)
	}
	v := b[len(f.Magic)]
	if !slices.Contains(f.Versions, v) {
		return 0, nil, fmt.Errorf("%w: version %d, this build reads %d", f.Err, v, f.Versions[0])
	}
	return v, &Reader{b: body[f.HeaderSize():], fail: f.Err}, nil
}

// Reader reads a record's body. The first error sticks: after it, every
// read returns zero and the error stays the first one.
type Reader struct {
	b    []byte
	err  error
	fail error
}

// NewReader reads b, its errors wrapping errFormat.
func NewReader(b []byte, errFormat error) *Reader { return &Reader{b: b, fail: errFormat} }

// Err is the first error, or nil.
func (r *Reader) Err() error { return r.err }

// Len is how many bytes are left.
func (r *Reader) Len() int { return len(r.b) }

// Fail records msg as the error, unless one is already, and drops the
// rest of the body.
func (r *Reader) Fail(msg string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", r.fail, msg)
	}
	r.b = nil
}

// Close fails on trailing bytes and returns the error, if any.
func (r *Reader) Close() error {
	if r.err == nil && len(r.b) > 0 {
		r.Fail(fmt.Sprintf("%d trailing bytes", len(r.b)))
	}
	return r.err
}

// Rest returns the bytes left, and leaves none.
func (r *Reader) Rest() []byte {
	b := r.b
	r.b = r.b[len(r.b):]
	return b
}

// Trailer cuts the last n bytes off the body and returns them, or fails
// with "truncated".
func (r *Reader) Trailer(n int) []byte {
	if n > len(r.b) {
		r.Fail("truncated")
		return nil
	}
	t := r.b[len(r.b)-n:]
	r.b = r.b[:len(r.b)-n]
	return t
}

// Take returns the next n bytes, or fails with msg if fewer are left.
func (r *Reader) Take(n int, msg string) []byte {
	if r.err != nil || n < 0 || n > len(r.b) {
		r.Fail(msg)
		return nil
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// Uint16 reads 2 bytes, little endian, or fails with msg.
func (r *Reader) Uint16(msg string) uint16 {
	if b := r.Take(2, msg); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

// Uint32 reads 4 bytes, little endian, or fails with msg.
func (r *Reader) Uint32(msg string) uint32 {
	if b := r.Take(4, msg); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

// Uint64 reads 8 bytes, little endian, or fails with msg.
func (r *Reader) Uint64(msg string) uint64 {
	if b := r.Take(8, msg); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

// Uvarint reads an unsigned varint in its shortest form: a longer one (a
// redundant continuation byte) is refused, so each value has one encoding.
func (r *Reader) Uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	if n <= 0 || n != len(binary.AppendUvarint(nil, v)) {
		r.Fail("truncated, overlong or padded integer")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// Varint is Uvarint for a signed varint.
func (r *Reader) Varint() int64 {
	v, n := binary.Varint(r.b)
	if n <= 0 || n != len(binary.AppendVarint(nil, v)) {
		r.Fail("truncated, overlong or padded integer")
		return 0
	}
	r.b = r.b[n:]
	return v
}

// Count reads a uvarint of at most limit; a larger one fails with format,
// given the value and limit (as "%d rules, more than %d").
func (r *Reader) Count(limit int, format string) int {
	v := r.Uvarint()
	if v > uint64(limit) {
		r.Fail(fmt.Sprintf(format, v, limit))
		return 0
	}
	return int(v)
}

// Writer writes a record to an io.Writer as it goes, buffered, and keeps
// its checksum. The first error sticks.
type Writer struct {
	w   *bufio.Writer
	crc uint32
	err error
}

// NewWriter writes f's magic and version to w and returns the writer for
// the body.
func (f *Format) NewWriter(w io.Writer) *Writer {
	wr := &Writer{w: bufio.NewWriterSize(w, 1<<16)}
	wr.Write(f.Append(nil))
	return wr
}

// Write writes b, unless an earlier write failed, and returns the first
// error.
func (w *Writer) Write(b []byte) error {
	if w.err == nil {
		_, w.err = w.w.Write(b)
		w.crc = crc32.Update(w.crc, Castagnoli, b)
	}
	return w.err
}

// Err is the first error, or nil.
func (w *Writer) Err() error { return w.err }

// Close writes the checksum and flushes.
func (w *Writer) Close() error {
	w.Write(binary.LittleEndian.AppendUint32(nil, w.crc))
	if w.err == nil {
		w.err = w.w.Flush()
	}
	return w.err
}
