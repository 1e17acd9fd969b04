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
// time since, at its group's saved weight. The framing (magic, version,
// checksum) and its checks are internal/record's, shared with package demand.
//
// It must never know the engine or membership (the daemon turns the engine's
// buckets and the views into these values and back), and never replace the
// file in place: a crash mid-write leaves the previous snapshot whole.
package state

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/internal/record"
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

var (
	format = &record.Format{Magic: magic, Versions: []byte{version}, Err: ErrFormat, What: "state file",
		Corrupt: "checksum mismatch (truncated or corrupt)", MinSize: len(magic) + 1 + 16 + 2 + trailerSize}
	// castagnoli is the checksum's table, as the tests reseal records.
	castagnoli = record.Castagnoli
)

// Encoder writes one snapshot to w: the header at once, buckets as Add is
// given them, the trailer on Close.
type Encoder struct {
	w     *record.Writer
	count uint64
	rec   [recordSize]byte
}

// NewEncoder writes h to w and returns the encoder for the buckets.
func NewEncoder(w io.Writer, h Header) (*Encoder, error) {
	if len(h.Views) > MaxViews || len(h.Weights) > MaxGroups {
		return nil, fmt.Errorf("%w: %d views, %d weights", ErrFormat, len(h.Views), len(h.Weights))
	}
	b := binary.LittleEndian.AppendUint64(nil, uint64(h.Written.UnixNano()))
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
	e := &Encoder{w: format.NewWriter(w)}
	return e, e.w.Write(b)
}

// Add writes buckets. A full one (fill ≥ 1, or not a number) is skipped: it
// is the same as none.
func (e *Encoder) Add(batch []bucket.Saved) error {
	for _, s := range batch {
		if e.w.Err() != nil {
			return e.w.Err()
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
		e.w.Write(r)
		e.count++
	}
	return e.w.Err()
}

// Count is how many buckets were written.
func (e *Encoder) Count() uint64 { return e.count }

// Close writes the trailer and flushes.
func (e *Encoder) Close() error {
	e.w.Write(binary.LittleEndian.AppendUint64(nil, e.count))
	return e.w.Close()
}

// Decode reads a snapshot. Anything but exactly one well-formed snapshot of
// this version is an error wrapping ErrFormat, and nothing of it is used.
func Decode(b []byte) (Snapshot, error) {
	var s Snapshot
	_, d, err := format.Open(b)
	if err != nil {
		return s, err
	}
	count := binary.LittleEndian.Uint64(d.Trailer(8)) // Open's MinSize leaves the count
	s.Written = time.Unix(0, int64(d.Uint64("truncated")))
	s.Seed = d.Uint64("truncated")
	nw := d.Count(MaxGroups, countFormat)
	for i := 0; i < nw && d.Err() == nil; i++ {
		w := math.Float64frombits(d.Uint64("truncated"))
		if !(w >= 0 && w <= 1) {
			d.Fail("weight outside [0, 1]")
		}
		s.Weights = append(s.Weights, w)
	}
	nv := d.Count(MaxViews, countFormat)
	for i := 0; i < nv && d.Err() == nil; i++ {
		v := View{Group: d.Uint16("truncated")}
		v.Service = string(d.Take(d.Count(maxService, countFormat), "truncated"))
		v.Total, v.Local, v.TotalWeight, v.LocalWeight = count32(d), count32(d), count32(d), count32(d)
		v.Weight = math.Float64frombits(d.Uint64("truncated"))
		if !(v.Weight > 0 && v.Weight <= 1) || v.Local > v.Total || v.LocalWeight > v.TotalWeight {
			d.Fail("a view out of range")
		}
		s.Views = append(s.Views, v)
	}
	if d.Err() != nil {
		return Snapshot{}, d.Err()
	}
	rest := d.Rest()
	if uint64(len(rest)) != count*recordSize || count > uint64(len(rest)) {
		return Snapshot{}, fmt.Errorf("%w: %d bytes of buckets for a count of %d", ErrFormat, len(rest), count)
	}
	s.Buckets = make([]bucket.Saved, count)
	for i := range s.Buckets {
		r := rest[i*recordSize : (i+1)*recordSize]
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

// countFormat is the error of a count above its bound.
const countFormat = "a count of %d, more than %d"

// count32 reads a view's count, at most MaxInt32.
func count32(d *record.Reader) int {
	v := d.Uvarint()
	if v > math.MaxInt32 {
		d.Fail("a count out of range")
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
