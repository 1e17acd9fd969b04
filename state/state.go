// Package state is the daemon's snapshot file (--state-file): every live
// bucket, the key seed, each weight group's weight and the membership
// views, written on shutdown and every --state-interval, and read on start.
//
// Why a package of its own: the file crosses process lifetimes, so its
// format is versioned and checksummed, and a bad file (corrupt, truncated,
// from another version, oversized, from the future) must be refused whole,
// never half-read. Keeping the format and the file handling (write to a
// temporary file, fsync, rename, fsync the directory) apart from the engine
// lets both be tested as they are and fuzzed.
//
// The format, little endian:
//
//	magic    "SLS"                 3 bytes
//	version  1                     1 byte
//	written  wall clock, Unix ns   8 bytes
//	seed     the engine's key seed 8 bytes
//	weights  count (uvarint), then each group's weight (float64)
//	views    count (uvarint), then per view: group (2 bytes), service
//	         (uvarint length, bytes), total, local, total weight and local
//	         weight (uvarints), weight (float64)
//	buckets  24 bytes each: key (8), fill (float32), group (2), tag (2),
//	         rate and size (float32 each)
//	count    buckets (8 bytes)
//	crc      CRC-32C of everything before it (4 bytes)
//
// A bucket's fill is as of the written time: restoring refills it for the
// time since, at its group's saved weight.
package state

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

const (
	magic   = "SLS"
	version = 1
	// recordSize is one bucket's bytes.
	recordSize = 24
	// trailerSize is the count and the checksum.
	trailerSize = 12
	// MaxViews bounds the views of a snapshot, as the daemon's 64 services.
	MaxViews = 1024
	// MaxGroups bounds the weights of a snapshot, as the engine's groups.
	MaxGroups = 1 << 16
	// maxService bounds a service name.
	maxService = 1024
)

// ErrFormat marks a file that is not a valid snapshot of this version.
var ErrFormat = errors.New("state: not a valid snapshot")

// View is a membership view as saved: which group it divides, and its
// figures.
type View struct {
	Group       uint16
	Service     string // "" for the static view
	Total       int
	Local       int
	TotalWeight int
	LocalWeight int
	Weight      float64
}

// Header is everything a snapshot holds but its buckets.
type Header struct {
	Written time.Time
	Seed    uint64
	Weights []float64 // by group
	Views   []View
}

// Snapshot is a snapshot as read.
type Snapshot struct {
	Header
	Buckets []bucket.Saved
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Encoder writes one snapshot to w: the header at once, buckets as Add is
// given them, the trailer on Close.
type Encoder struct {
	w     *bufio.Writer
	crc   hash.Hash32
	count uint64
	rec   [recordSize]byte
	err   error
}

// NewEncoder writes h to w and returns the encoder for the buckets.
func NewEncoder(w io.Writer, h Header) (*Encoder, error) {
	if len(h.Views) > MaxViews || len(h.Weights) > MaxGroups {
		return nil, fmt.Errorf("%w: %d views, %d weights", ErrFormat, len(h.Views), len(h.Weights))
	}
	crc := crc32.New(castagnoli)
	e := &Encoder{w: bufio.NewWriterSize(io.MultiWriter(w, crc), 1<<16), crc: crc}
	b := append([]byte(magic), version)
	b = binary.LittleEndian.AppendUint64(b, uint64(h.Written.UnixNano()))
	b = binary.LittleEndian.AppendUint64(b, h.Seed)
	b = binary.AppendUvarint(b, uint64(len(h.Weights)))
	for _, w := range h.Weights {
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(w))
	}
	b = binary.AppendUvarint(b, uint64(len(h.Views)))
	for _, v := range h.Views {
		if len(v.Service) > maxService || v.Total < 0 || v.Local < 0 || v.TotalWeight < 0 || v.LocalWeight < 0 {
			return nil, fmt.Errorf("%w: view %+v", ErrFormat, v)
		}
		b = binary.LittleEndian.AppendUint16(b, v.Group)
		b = binary.AppendUvarint(b, uint64(len(v.Service)))
		b = append(b, v.Service...)
		for _, n := range []int{v.Total, v.Local, v.TotalWeight, v.LocalWeight} {
			b = binary.AppendUvarint(b, uint64(n))
		}
		b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v.Weight))
	}
	_, e.err = e.w.Write(b)
	return e, e.err
}

// Add writes buckets. A full one (fill ≥ 1, or not a number) is skipped: it
// is the same as none.
func (e *Encoder) Add(batch []bucket.Saved) error {
	for _, s := range batch {
		if e.err != nil {
			return e.err
		}
		f := float32(s.Fill)
		if float64(f) > s.Fill {
			f = math.Nextafter32(f, float32(math.Inf(-1))) // rounded down: never fuller
		}
		if !(s.Fill < 1) || !(f < 1) {
			continue
		}
		f = max(f, -1)
		r := e.rec[:0]
		r = binary.LittleEndian.AppendUint64(r, s.Key)
		r = binary.LittleEndian.AppendUint32(r, math.Float32bits(f))
		r = binary.LittleEndian.AppendUint16(r, s.Group)
		r = binary.LittleEndian.AppendUint16(r, s.Tag)
		r = binary.LittleEndian.AppendUint32(r, math.Float32bits(s.Rate))
		r = binary.LittleEndian.AppendUint32(r, math.Float32bits(s.Size))
		_, e.err = e.w.Write(r)
		e.count++
	}
	return e.err
}

// Count is how many buckets were written.
func (e *Encoder) Count() uint64 { return e.count }

// Close writes the trailer and flushes.
func (e *Encoder) Close() error {
	if e.err != nil {
		return e.err
	}
	var t [8]byte
	binary.LittleEndian.PutUint64(t[:], e.count)
	if _, err := e.w.Write(t[:]); err != nil {
		return err
	}
	if err := e.w.Flush(); err != nil {
		return err
	}
	var c [4]byte
	binary.LittleEndian.PutUint32(c[:], e.crc.Sum32())
	// The checksum goes past the hash: write it to the file alone.
	_, err := e.w.Write(c[:])
	if err == nil {
		err = e.w.Flush()
	}
	return err
}

// Decode reads a snapshot. Anything but exactly one well-formed snapshot of
// this version is an error wrapping ErrFormat, and nothing of it is used.
func Decode(b []byte) (Snapshot, error) {
	var s Snapshot
	if len(b) < len(magic)+1+16+2+trailerSize || string(b[:len(magic)]) != magic {
		return s, fmt.Errorf("%w: not a sharelimit state file", ErrFormat)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return s, fmt.Errorf("%w: checksum mismatch (truncated or corrupt)", ErrFormat)
	}
	if v := b[len(magic)]; v != version {
		return s, fmt.Errorf("%w: version %d, this build reads %d", ErrFormat, v, version)
	}
	count := binary.LittleEndian.Uint64(body[len(body)-8:])
	d := decoder{b: body[len(magic)+1 : len(body)-8]}
	s.Written = time.Unix(0, int64(d.u64()))
	s.Seed = d.u64()
	nw := d.count(MaxGroups)
	for i := 0; i < nw && d.err == nil; i++ {
		w := math.Float64frombits(d.u64())
		if !(w >= 0 && w <= 1) {
			d.fail("weight outside [0, 1]")
		}
		s.Weights = append(s.Weights, w)
	}
	nv := d.count(MaxViews)
	for i := 0; i < nv && d.err == nil; i++ {
		v := View{Group: d.u16()}
		n := d.count(maxService)
		v.Service = string(d.take(n))
		v.Total, v.Local, v.TotalWeight, v.LocalWeight = d.int(), d.int(), d.int(), d.int()
		v.Weight = math.Float64frombits(d.u64())
		if !(v.Weight > 0 && v.Weight <= 1) || v.Local > v.Total || v.LocalWeight > v.TotalWeight {
			d.fail("a view out of range")
		}
		s.Views = append(s.Views, v)
	}
	if d.err != nil {
		return Snapshot{}, d.err
	}
	if uint64(len(d.b)) != count*recordSize || count > uint64(len(d.b)) {
		return Snapshot{}, fmt.Errorf("%w: %d bytes of buckets for a count of %d", ErrFormat, len(d.b), count)
	}
	s.Buckets = make([]bucket.Saved, count)
	for i := range s.Buckets {
		r := d.b[i*recordSize : (i+1)*recordSize]
		f := math.Float32frombits(binary.LittleEndian.Uint32(r[8:]))
		sv := bucket.Saved{
			Key: binary.LittleEndian.Uint64(r), Fill: float64(f),
			Group: binary.LittleEndian.Uint16(r[12:]), Tag: binary.LittleEndian.Uint16(r[14:]),
			Rate: math.Float32frombits(binary.LittleEndian.Uint32(r[16:])),
			Size: math.Float32frombits(binary.LittleEndian.Uint32(r[20:])),
		}
		if !(f >= -1 && f < 1) || !finite(sv.Rate) || !finite(sv.Size) {
			return Snapshot{}, fmt.Errorf("%w: bucket %d out of range", ErrFormat, i)
		}
		s.Buckets[i] = sv
	}
	return s, nil
}

func finite(f float32) bool { return f >= 0 && f <= math.MaxFloat32 }

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(msg string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrFormat, msg)
	}
	d.b = nil
}

func (d *decoder) take(n int) []byte {
	if d.err != nil || n > len(d.b) {
		d.fail("truncated")
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) u64() uint64 {
	if b := d.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if b := d.take(2); b != nil {
		return binary.LittleEndian.Uint16(b)
	}
	return 0
}

// uvarint reads an unsigned varint in its shortest form.
func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 || n != len(binary.AppendUvarint(nil, v)) {
		d.fail("truncated, overlong or padded integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) count(limit int) int {
	v := d.uvarint()
	if v > uint64(limit) {
		d.fail(fmt.Sprintf("a count of %d, more than %d", v, limit))
		return 0
	}
	return int(v)
}

func (d *decoder) int() int {
	v := d.uvarint()
	if v > math.MaxInt32 {
		d.fail("a count out of range")
		return 0
	}
	return int(v)
}

// WriteFile writes a snapshot to path atomically: to a temporary file in the
// same directory, fsynced, renamed over path, and the directory fsynced, so
// a crash at any point leaves either the old file or the new one, whole.
// export is called with the encoder's Add; it may call it many times.
func WriteFile(path string, h Header, export func(add func([]bucket.Saved) error) error) (count uint64, size int64, err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return 0, 0, err
	}
	tmp := f.Name()
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(tmp)
		}
	}()
	enc, err := NewEncoder(f, h)
	if err != nil {
		return 0, 0, err
	}
	if err = export(enc.Add); err != nil {
		return 0, 0, err
	}
	if err = enc.Close(); err != nil {
		return 0, 0, err
	}
	if err = f.Sync(); err != nil {
		return 0, 0, err
	}
	st, err := f.Stat()
	if err != nil {
		return 0, 0, err
	}
	if err = f.Close(); err != nil {
		return 0, 0, err
	}
	if err = os.Rename(tmp, path); err != nil {
		return 0, 0, err
	}
	if d, derr := os.Open(dir); derr == nil {
		err = d.Sync()
		d.Close()
	}
	return enc.Count(), st.Size(), err
}

// ReadFile reads the snapshot at path, refusing a file larger than maxSize
// bytes before reading it.
func ReadFile(path string, maxSize int64) (Snapshot, error) {
	// Looked at before it is opened: opening a FIFO would wait for a
	// writer, and the daemon's start with it.
	if st, err := os.Stat(path); err != nil {
		return Snapshot{}, err
	} else if !st.Mode().IsRegular() {
		return Snapshot{}, fmt.Errorf("%w: %s is not a regular file", ErrFormat, path)
	}
	f, err := os.Open(path)
	if err != nil {
		return Snapshot{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Snapshot{}, err
	}
	if !st.Mode().IsRegular() {
		return Snapshot{}, fmt.Errorf("%w: %s is not a regular file", ErrFormat, path)
	}
	if st.Size() > maxSize {
		return Snapshot{}, fmt.Errorf("%w: %d bytes, more than the %d a snapshot of --max-buckets can take", ErrFormat, st.Size(), maxSize)
	}
	b := make([]byte, st.Size())
	if _, err := io.ReadFull(f, b); err != nil {
		return Snapshot{}, err
	}
	return Decode(b)
}

// MaxSize is the largest snapshot of at most buckets buckets, with room for
// the largest header.
func MaxSize(buckets int) int64 {
	return int64(buckets)*recordSize + trailerSize + 64 + MaxGroups*8 + MaxViews*(2+maxService+4*10+8+10)
}
