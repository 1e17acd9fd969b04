package demand

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/sharelimit/sharelimit/internal/record"
)

// Wire format, shared by reports and parameters:
//
//	magic   "SLD"            3 bytes
//	version 3                1 byte
//	kind    1 report, 2 params
//	body                     (below)
//	crc     CRC-32C          4 bytes, little endian, of everything before it
//
// The framing (magic, version, checksum) and its checks are internal/record's,
// shared with package state. Integers in the body are unsigned varints, times are signed varints (Unix
// nanoseconds), rates are float32 bits (4 bytes, little endian: seven digits
// are more than a smoothed rate carries; the division's figures are rounded
// toward zero, so what the replicas read is never looser than what the leader
// computed; a reader compares its own report as decoded, not as measured), strings are a varint length and
// bytes. Rules are sorted by ID, without duplicates.
//
// report body: seq, at, units, node, rules: count, then per rule its ID
// (8 bytes), offered, admitted and its values: count, then per value its
// ID (8 bytes), offered and admitted.
//
// params body: at, snapshot, units, headroom, floor, leader, the reports
// divided: count, then per report, from the latest write down, the gap to
// its index (from the snapshot for the first, from the previous for the
// others, which is at least 1) and its node's tag (2 bytes, little endian);
// then rules: count, then per rule its ID (8 bytes), limit, K, R, the
// cluster's admitted rate and its values: count, then per value its ID (8
// bytes), K, R and the cluster's admitted rate.
//
// Values are a per-value rule's hot values (and, in reports, candidates),
// sorted by ID, without duplicates; a rule with one bucket has none.
//
// Versions. Version 1 had no values. Version 2 had no list of the reports
// divided, and a cutoff index in its place, which the leader never set: a
// replica could not tell a division that counted its report from one that
// did not. A version 3 reader refuses reports of other versions (their
// replicas count at their equal share), and reads version 2 parameters as
// dividing no report at all, so under an older leader every replica keeps
// at most its equal share: the older leader cannot read a version 3 report
// either, and counts its replica at its equal share too. A version 2 reader
// refuses version 3 records, as it did version 1's.
const (
	magic   = "SLD"
	version = 3
	// legacyParams is the older parameters' version that is still read.
	legacyParams = 2

	kindReport = 1
	kindParams = 2

	// MaxRules bounds the rules of one report or parameter set.
	MaxRules = 1024
	// MaxNode bounds a node name, as Consul's own limit on node names.
	MaxNode = 253
	// MaxValues bounds the values of one report or parameter set, over all
	// its rules.
	MaxValues = 4096
	// MaxReports bounds the reports one parameter set lists: a division
	// of a service with more replicas lists the first MaxReports by node
	// name and counts the others at their equal shares.
	MaxReports = 8192
	// MaxSize bounds an encoded report or parameter set: MaxRules rules,
	// MaxValues values, MaxReports reports and the longest node name fit
	// with room to spare.
	MaxSize = 32 + MaxNode + 8 + MaxRules*(8+4*4+3) + MaxValues*(8+3*4) + MaxReports*(10+2)
)

// ErrFormat marks bytes that are not a valid report or parameter set.
var ErrFormat = errors.New("demand: bad encoding")

// ordered is a rule's entry in a report or a parameter set, as the
// encoders check its order.
type ordered interface {
	id() RuleID
	nvalues() int
	valueID(j int) uint64
}

func (d RuleDemand) id() RuleID           { return d.ID }
func (d RuleDemand) nvalues() int         { return len(d.Values) }
func (d RuleDemand) valueID(j int) uint64 { return d.Values[j].ID }
func (r RuleParams) id() RuleID           { return r.ID }
func (r RuleParams) nvalues() int         { return len(r.Values) }
func (r RuleParams) valueID(j int) uint64 { return r.Values[j].ID }

// checkOrder refuses what the decoders would: rules, or a rule's values,
// out of order or repeated, and more than MaxValues values in all.
func checkOrder[E ordered](rules []E) error {
	values := 0
	for i, r := range rules {
		if i > 0 && rules[i-1].id() >= r.id() {
			return fmt.Errorf("%w: rules not sorted by ID", ErrFormat)
		}
		for j := 1; j < r.nvalues(); j++ {
			if r.valueID(j-1) >= r.valueID(j) {
				return fmt.Errorf("%w: values not sorted by ID", ErrFormat)
			}
		}
		values += r.nvalues()
	}
	if values > MaxValues {
		return fmt.Errorf("%w: %d values, more than %d", ErrFormat, values, MaxValues)
	}
	return nil
}

// AppendReport appends r's encoding to b. It fails on what DecodeReport
// would refuse: too many rules, a node name too long, rules out of order.
func AppendReport(b []byte, r *Report) ([]byte, error) {
	if len(r.Rules) > MaxRules || len(r.Node) > MaxNode {
		return b, fmt.Errorf("%w: %d rules, node name of %d bytes", ErrFormat, len(r.Rules), len(r.Node))
	}
	if err := checkOrder(r.Rules); err != nil {
		return b, err
	}
	start := len(b)
	b = append(reports.Append(b), kindReport)
	b = binary.AppendUvarint(b, r.Seq)
	b = binary.AppendVarint(b, r.At)
	b = binary.AppendUvarint(b, uint64(r.Units))
	b = appendString(b, r.Node)
	b = binary.AppendUvarint(b, uint64(len(r.Rules)))
	for _, d := range r.Rules {
		b = binary.LittleEndian.AppendUint64(b, uint64(d.ID))
		b = appendRate(b, d.Offered)
		b = appendRate(b, d.Admitted)
		b = binary.AppendUvarint(b, uint64(len(d.Values)))
		for _, v := range d.Values {
			b = binary.LittleEndian.AppendUint64(b, v.ID)
			b = appendRate(b, v.Offered)
			b = appendRate(b, v.Admitted)
		}
	}
	return record.Seal(b, start), nil
}

// AppendParams appends p's encoding to b; see AppendReport. It also fails
// on reports out of order or repeated, at index 0 or above the snapshot.
func AppendParams(b []byte, p *Params) ([]byte, error) {
	if len(p.Rules) > MaxRules || len(p.Leader) > MaxNode || len(p.Reports) > MaxReports {
		return b, fmt.Errorf("%w: %d rules, %d reports, leader name of %d bytes", ErrFormat, len(p.Rules), len(p.Reports), len(p.Leader))
	}
	if err := checkOrder(p.Rules); err != nil {
		return b, err
	}
	for i, r := range p.Reports {
		if r.Index == 0 || r.Index > p.Snapshot || (i > 0 && p.Reports[i-1].Index >= r.Index) {
			return b, fmt.Errorf("%w: reports not sorted by index, or at index 0 or past the snapshot", ErrFormat)
		}
	}
	start := len(b)
	b = append(params.Append(b), kindParams)
	b = binary.AppendVarint(b, p.At)
	b = binary.AppendUvarint(b, p.Snapshot)
	b = binary.AppendUvarint(b, uint64(len(p.Reports)))
	next := p.Snapshot
	for i := len(p.Reports) - 1; i >= 0; i-- {
		r := p.Reports[i]
		b = binary.AppendUvarint(b, next-r.Index)
		b = binary.LittleEndian.AppendUint16(b, uint16(r.Node))
		next = r.Index
	}
	b = binary.AppendUvarint(b, uint64(p.Units))
	b = appendDown(b, p.Headroom)
	b = appendDown(b, p.Floor)
	b = appendString(b, p.Leader)
	b = binary.AppendUvarint(b, uint64(len(p.Rules)))
	for _, r := range p.Rules {
		b = binary.LittleEndian.AppendUint64(b, uint64(r.ID))
		b = appendRate(b, r.Limit)
		b = appendDown(b, r.K)
		b = appendDown(b, r.R)
		b = appendRate(b, r.Admitted)
		b = binary.AppendUvarint(b, uint64(len(r.Values)))
		for _, v := range r.Values {
			b = binary.LittleEndian.AppendUint64(b, v.ID)
			b = appendDown(b, v.K)
			b = appendDown(b, v.R)
			b = appendRate(b, v.Admitted)
		}
	}
	return record.Seal(b, start), nil
}

// DecodeReport decodes a report. Anything but exactly one well-formed
// report (wrong magic, version or kind, a bad checksum, trailing bytes,
// rules out of order, a rate that is negative, NaN or infinite) is an
// error wrapping ErrFormat.
func DecodeReport(b []byte) (Report, error) {
	var r Report
	_, d, err := open(reports, b, kindReport)
	if err != nil {
		return r, err
	}
	r.Seq = d.Uvarint()
	r.At = d.Varint()
	r.Units = d.uint32()
	r.Node = d.string()
	n := d.Count(MaxRules, "%d rules, more than %d")
	if d.Err() == nil && n > 0 {
		r.Rules = make([]RuleDemand, n)
	}
	for i := 0; i < n && d.Err() == nil; i++ {
		r.Rules[i] = RuleDemand{ID: d.id(), Offered: d.rate(), Admitted: d.rate()}
		if i > 0 && r.Rules[i-1].ID >= r.Rules[i].ID {
			d.Fail("rules not sorted by ID")
		}
		m := d.values()
		if d.Err() == nil && m > 0 {
			r.Rules[i].Values = make([]ValueDemand, m)
		}
		for j := 0; j < m && d.Err() == nil; j++ {
			v := ValueDemand{ID: uint64(d.id()), Offered: d.rate(), Admitted: d.rate()}
			if j > 0 && r.Rules[i].Values[j-1].ID >= v.ID {
				d.Fail("values not sorted by ID")
			}
			r.Rules[i].Values[j] = v
		}
	}
	return r, d.Close()
}

// DecodeParams decodes a parameter set; see DecodeReport. K must lie in
// [0, 1] and R in [0, 1]. A version 2 parameter set decodes with no
// reports: it counted none that a replica can recognise as its own.
func DecodeParams(b []byte) (Params, error) {
	var p Params
	v, d, err := open(params, b, kindParams)
	if err != nil {
		return p, err
	}
	p.At = d.Varint()
	p.Snapshot = d.Uvarint()
	if v == legacyParams {
		d.Uvarint() // the cutoff, which no leader set
	} else {
		p.Reports = d.reports(p.Snapshot)
	}
	p.Units = d.uint32()
	p.Headroom = d.rate()
	p.Floor = d.rate()
	p.Leader = d.string()
	n := d.Count(MaxRules, "%d rules, more than %d")
	if d.Err() == nil && n > 0 {
		p.Rules = make([]RuleParams, n)
	}
	for i := 0; i < n && d.Err() == nil; i++ {
		r := RuleParams{ID: d.id(), Limit: d.rate(), K: d.rate(), R: d.rate(), Admitted: d.rate()}
		if r.K > 1 || r.R > 1 {
			d.Fail("K or R above 1")
		}
		if i > 0 && p.Rules[i-1].ID >= r.ID {
			d.Fail("rules not sorted by ID")
		}
		m := d.values()
		if d.Err() == nil && m > 0 {
			r.Values = make([]ValueParams, m)
		}
		for j := 0; j < m && d.Err() == nil; j++ {
			v := ValueParams{ID: uint64(d.id()), K: d.rate(), R: d.rate(), Admitted: d.rate()}
			if v.K > 1 || v.R > 1 {
				d.Fail("K or R above 1")
			}
			if j > 0 && r.Values[j-1].ID >= v.ID {
				d.Fail("values not sorted by ID")
			}
			r.Values[j] = v
		}
		p.Rules[i] = r
	}
	return p, d.Close()
}

func appendString(b []byte, s string) []byte {
	return append(binary.AppendUvarint(b, uint64(len(s))), s...)
}

func appendRate(b []byte, v float64) []byte {
	if !(v >= 0) || v > math.MaxFloat32 {
		v = 0 // never written by this package; kept decodable
	}
	return binary.LittleEndian.AppendUint32(b, math.Float32bits(float32(v)))
}

// appendDown is appendRate rounding toward zero: the tuning figures and K and
// R may only shrink on the way to the replicas, which makes their shares
// tighter than the leader's division, never looser.
func appendDown(b []byte, v float64) []byte {
	if v >= 0 && v <= math.MaxFloat32 {
		f := float32(v)
		if float64(f) > v {
			f = math.Nextafter32(f, 0)
		}
		v = float64(f)
	}
	return appendRate(b, v)
}

// format is the framing of records of the given versions: reports are read
// at this version alone, parameters at this one and the legacy one.
func format(versions ...byte) *record.Format {
	return &record.Format{Magic: magic, Versions: versions, Err: ErrFormat, What: "demand record",
		Corrupt: "checksum mismatch", MinSize: len(magic) + 2 + 4, MaxSize: MaxSize}
}

var (
	reports, params = format(version), format(version, legacyParams)
	// castagnoli is the checksum's table, as the tests reseal records.
	castagnoli = record.Castagnoli
)

// decoder reads a body; the first error sticks.
type decoder struct {
	*record.Reader
	nvalues int
}

// open checks b's framing and kind, and returns its version and a decoder
// of the rest.
func open(f *record.Format, b []byte, kind byte) (byte, *decoder, error) {
	v, r, err := f.Open(b)
	if err != nil {
		return 0, nil, err
	}
	if k := r.Take(1, "")[0]; k != kind { // Open's MinSize leaves the kind
		return 0, nil, fmt.Errorf("%w: kind %d, want %d", ErrFormat, k, kind)
	}
	return v, &decoder{Reader: r}, nil
}

func (d *decoder) uint32() uint32 {
	v := d.Uvarint()
	if v > math.MaxUint32 {
		d.Fail("units out of range")
		return 0
	}
	return uint32(v)
}

// values reads a rule's count of values, which with the values before it
// must stay within MaxValues.
func (d *decoder) values() int {
	v := d.Uvarint()
	if d.Err() != nil {
		return 0
	}
	if v > uint64(MaxValues-d.nvalues) {
		d.Fail(fmt.Sprintf("more than %d values", MaxValues))
		return 0
	}
	d.nvalues += int(v)
	return int(v)
}

// reports reads a parameter set's reports, each at most snapshot and at
// least 1, and returns them sorted by index.
func (d *decoder) reports(snapshot uint64) []ReportRef {
	n := d.Count(MaxReports, "%d reports, more than %d")
	if n == 0 {
		return nil
	}
	out := make([]ReportRef, n)
	next := snapshot
	for i := len(out) - 1; i >= 0 && d.Err() == nil; i-- {
		gap := d.Uvarint()
		tag := NodeTag(d.Uint16("truncated node tag"))
		if d.Err() != nil {
			return nil
		}
		if (gap == 0 && i < len(out)-1) || gap >= next {
			d.Fail("report indices repeated, past the snapshot or at 0")
			return nil
		}
		next -= gap
		out[i] = ReportRef{Index: next, Node: tag}
	}
	if d.Err() != nil {
		return nil
	}
	return out
}

func (d *decoder) string() string {
	n := d.Uvarint()
	if d.Err() == nil && (n > MaxNode || n > uint64(d.Len())) {
		d.Fail("string too long or truncated")
	}
	return string(d.Take(int(min(n, MaxNode)), "string too long or truncated"))
}

func (d *decoder) id() RuleID { return RuleID(d.Uint64("truncated rule ID")) }

func (d *decoder) rate() float64 {
	v := math.Float32frombits(d.Uint32("truncated rate"))
	if d.Err() == nil && (!(v >= 0) || math.IsInf(float64(v), 0)) {
		d.Fail("rate negative, NaN or infinite")
		return 0
	}
	return float64(v)
}
