package demand

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"hash/fnv"
	"math"
	"slices"
)

// Wire format, shared by reports and parameters:
//
//	magic   "SLD"            3 bytes
//	version 3                1 byte
//	kind    1 report, 2 params
//	body                     (below)
//	crc     CRC-32C          4 bytes, little endian, of everything before it
//
// Integers in the body are unsigned varints, times are signed varints (Unix
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

// RuleID names a demand-shared rule the same way in every replica: FNV-1a of
// the rule's identity (its domain, path and limit), so two replicas whose
// config differs for a rule never read each other's figures for it.
type RuleID uint64

// RuleIDOf is the RuleID of a rule identity.
func RuleIDOf(identity string) RuleID {
	h := fnv.New64a()
	h.Write([]byte(identity))
	return RuleID(h.Sum64())
}

// Report is what one replica publishes: its demand per rule.
type Report struct {
	Seq   uint64 // increases with every report of a process
	At    int64  // the writer's wall clock, Unix nanoseconds
	Units uint32 // the replica's weight units
	Node  string
	Rules []RuleDemand // sorted by ID
}

// RuleDemand is one rule's figures in a report, per second, smoothed.
type RuleDemand struct {
	ID       RuleID
	Offered  float64 // tokens asked for, admitted or not
	Admitted float64 // tokens admitted
	// Values are a per-value rule's values: each hot value of the
	// parameters the replica last had (demand 0 included), then its own
	// hottest other values, as candidates. Sorted by ID.
	Values []ValueDemand
}

// ValueDemand is one value's figures in a report, per second.
type ValueDemand struct {
	ID       uint64
	Offered  float64
	Admitted float64
}

// FindValue returns value id's figures, or nil.
func (r *RuleDemand) FindValue(id uint64) *ValueDemand {
	i, ok := slices.BinarySearchFunc(r.Values, id, func(v ValueDemand, id uint64) int { return cmpID(RuleID(v.ID), RuleID(id)) })
	if !ok {
		return nil
	}
	return &r.Values[i]
}

// Params is what the leader publishes for a service: the division of each
// demand-shared rule, from one snapshot of the reports.
type Params struct {
	At       int64  // the leader's wall clock when it divided, Unix nanoseconds
	Snapshot uint64 // the Consul index the reports were read at
	// Reports are the reports the division counted, each by the index of
	// its write and its node's tag, sorted by index: a replica finds its
	// own there, and one that does not took no part in the division
	// beyond its equal share (History.Reported). Indices are at most
	// Snapshot and at least 1, without duplicates.
	Reports  []ReportRef
	Units    uint32 // U, the units divided among
	Headroom float64
	Floor    float64
	Leader   string
	Rules    []RuleParams // sorted by ID
}

// ReportRef names one report a division counted: the Consul index its
// write got (a write's index is its own: no other report has it) and the
// tag of the node whose key held it.
type ReportRef struct {
	Index uint64
	Node  NodeTag
}

// NodeTag is a node name in two bytes, as a parameter set lists the
// reports it divided. Two nodes may share a tag: a replica that finds its
// tag at an index it did not write reads that as a report it cannot know
// (Unknown), which is tighter, never looser, than what it would otherwise
// take.
type NodeTag uint16

// TagOf is node's tag: the low bits of FNV-1a of its name.
func TagOf(node string) NodeTag {
	h := fnv.New64a()
	h.Write([]byte(node))
	return NodeTag(h.Sum64())
}

// RuleParams is one rule's division.
type RuleParams struct {
	ID       RuleID
	Limit    float64 // L as the leader's config has it, per second
	K, R     float64
	Admitted float64 // the cluster's admitted rate, per second
	// Values are a per-value rule's hot values, each divided on its own
	// (its limit is the rule's); every other value keeps the equal share.
	// Sorted by ID. A per-value rule's own K and R are 0.
	Values []ValueParams
}

// ValueParams is one hot value's division.
type ValueParams struct {
	ID       uint64
	K, R     float64
	Admitted float64
}

// FindValue returns hot value id's division, or nil.
func (r *RuleParams) FindValue(id uint64) *ValueParams {
	i, ok := slices.BinarySearchFunc(r.Values, id, func(v ValueParams, id uint64) int { return cmpID(RuleID(v.ID), RuleID(id)) })
	if !ok {
		return nil
	}
	return &r.Values[i]
}

// ValueRule is hot value v of rule r's division as Share takes it.
func (p *Params) ValueRule(r *RuleParams, v *ValueParams) Rule {
	return Rule{Limit: r.Limit, Units: p.Units, Headroom: p.Headroom, Floor: p.Floor, K: v.K, R: v.R}
}

// Rule is r's division as Share takes it.
func (p *Params) Rule(r *RuleParams) Rule {
	return Rule{Limit: r.Limit, Units: p.Units, Headroom: p.Headroom, Floor: p.Floor, K: r.K, R: r.R}
}

// Find returns the parameters of rule id, or nil.
func (p *Params) Find(id RuleID) *RuleParams {
	i, ok := slices.BinarySearchFunc(p.Rules, id, func(r RuleParams, id RuleID) int { return cmpID(r.ID, id) })
	if !ok {
		return nil
	}
	return &p.Rules[i]
}

// Find returns rule id's figures in the report, or nil.
func (r *Report) Find(id RuleID) *RuleDemand {
	i, ok := slices.BinarySearchFunc(r.Rules, id, func(d RuleDemand, id RuleID) int { return cmpID(d.ID, id) })
	if !ok {
		return nil
	}
	return &r.Rules[i]
}

func cmpID(a, b RuleID) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

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
	b = append(b, magic...)
	b = append(b, version, kindReport)
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
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli)), nil
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
	b = append(b, magic...)
	b = append(b, version, kindParams)
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
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b[start:], castagnoli)), nil
}

// DecodeReport decodes a report. Anything but exactly one well-formed
// report (wrong magic, version or kind, a bad checksum, trailing bytes,
// rules out of order, a rate that is negative, NaN or infinite) is an
// error wrapping ErrFormat.
func DecodeReport(b []byte) (Report, error) {
	var r Report
	d, err := open(b, kindReport, version)
	if err != nil {
		return r, err
	}
	r.Seq = d.uvarint()
	r.At = d.varint()
	r.Units = d.uint32()
	r.Node = d.string()
	n := d.count()
	if d.err == nil && n > 0 {
		r.Rules = make([]RuleDemand, n)
	}
	for i := 0; i < n && d.err == nil; i++ {
		r.Rules[i] = RuleDemand{ID: d.id(), Offered: d.rate(), Admitted: d.rate()}
		if i > 0 && r.Rules[i-1].ID >= r.Rules[i].ID {
			d.fail("rules not sorted by ID")
		}
		m := d.values()
		if d.err == nil && m > 0 {
			r.Rules[i].Values = make([]ValueDemand, m)
		}
		for j := 0; j < m && d.err == nil; j++ {
			v := ValueDemand{ID: uint64(d.id()), Offered: d.rate(), Admitted: d.rate()}
			if j > 0 && r.Rules[i].Values[j-1].ID >= v.ID {
				d.fail("values not sorted by ID")
			}
			r.Rules[i].Values[j] = v
		}
	}
	return r, d.close()
}

// DecodeParams decodes a parameter set; see DecodeReport. K must lie in
// [0, 1] and R in [0, 1]. A version 2 parameter set decodes with no
// reports: it counted none that a replica can recognise as its own.
func DecodeParams(b []byte) (Params, error) {
	var p Params
	d, err := open(b, kindParams, version, legacyParams)
	if err != nil {
		return p, err
	}
	p.At = d.varint()
	p.Snapshot = d.uvarint()
	if b[len(magic)] == legacyParams {
		d.uvarint() // the cutoff, which no leader set
	} else {
		p.Reports = d.reports(p.Snapshot)
	}
	p.Units = d.uint32()
	p.Headroom = d.rate()
	p.Floor = d.rate()
	p.Leader = d.string()
	n := d.count()
	if d.err == nil && n > 0 {
		p.Rules = make([]RuleParams, n)
	}
	for i := 0; i < n && d.err == nil; i++ {
		r := RuleParams{ID: d.id(), Limit: d.rate(), K: d.rate(), R: d.rate(), Admitted: d.rate()}
		if r.K > 1 || r.R > 1 {
			d.fail("K or R above 1")
		}
		if i > 0 && p.Rules[i-1].ID >= r.ID {
			d.fail("rules not sorted by ID")
		}
		m := d.values()
		if d.err == nil && m > 0 {
			r.Values = make([]ValueParams, m)
		}
		for j := 0; j < m && d.err == nil; j++ {
			v := ValueParams{ID: uint64(d.id()), K: d.rate(), R: d.rate(), Admitted: d.rate()}
			if v.K > 1 || v.R > 1 {
				d.fail("K or R above 1")
			}
			if j > 0 && r.Values[j-1].ID >= v.ID {
				d.fail("values not sorted by ID")
			}
			r.Values[j] = v
		}
		p.Rules[i] = r
	}
	return p, d.close()
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

// decoder reads a body; the first error sticks.
type decoder struct {
	b       []byte
	err     error
	nvalues int
}

func open(b []byte, kind byte, versions ...byte) (*decoder, error) {
	if len(b) > MaxSize {
		return nil, fmt.Errorf("%w: %d bytes, more than %d", ErrFormat, len(b), MaxSize)
	}
	if len(b) < len(magic)+2+4 || string(b[:len(magic)]) != magic {
		return nil, fmt.Errorf("%w: not a sharelimit demand record", ErrFormat)
	}
	body, sum := b[:len(b)-4], binary.LittleEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return nil, fmt.Errorf("%w: checksum mismatch", ErrFormat)
	}
	if v := b[len(magic)]; !slices.Contains(versions, v) {
		return nil, fmt.Errorf("%w: version %d, this build reads %d", ErrFormat, v, version)
	}
	if k := b[len(magic)+1]; k != kind {
		return nil, fmt.Errorf("%w: kind %d, want %d", ErrFormat, k, kind)
	}
	return &decoder{b: body[len(magic)+2:]}, nil
}

func (d *decoder) fail(msg string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrFormat, msg)
	}
	d.b = nil
}

func (d *decoder) close() error {
	if d.err == nil && len(d.b) > 0 {
		d.fail(fmt.Sprintf("%d trailing bytes", len(d.b)))
	}
	return d.err
}

// uvarint reads an unsigned varint in its shortest form: a longer one (a
// redundant continuation byte) is refused, so each value has one encoding.
func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 || n != len(binary.AppendUvarint(nil, v)) {
		d.fail("truncated, overlong or padded integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// varint is uvarint for a signed varint.
func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 || n != len(binary.AppendVarint(nil, v)) {
		d.fail("truncated, overlong or padded integer")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) uint32() uint32 {
	v := d.uvarint()
	if v > math.MaxUint32 {
		d.fail("units out of range")
		return 0
	}
	return uint32(v)
}

func (d *decoder) count() int {
	v := d.uvarint()
	if v > MaxRules {
		d.fail(fmt.Sprintf("%d rules, more than %d", v, MaxRules))
		return 0
	}
	return int(v)
}

// values reads a rule's count of values, which with the values before it
// must stay within MaxValues.
func (d *decoder) values() int {
	v := d.uvarint()
	if d.err != nil {
		return 0
	}
	if v > uint64(MaxValues-d.nvalues) {
		d.fail(fmt.Sprintf("more than %d values", MaxValues))
		return 0
	}
	d.nvalues += int(v)
	return int(v)
}

// reports reads a parameter set's reports, each at most snapshot and at
// least 1, and returns them sorted by index.
func (d *decoder) reports(snapshot uint64) []ReportRef {
	v := d.uvarint()
	if d.err != nil {
		return nil
	}
	if v > MaxReports {
		d.fail(fmt.Sprintf("%d reports, more than %d", v, MaxReports))
		return nil
	}
	if v == 0 {
		return nil
	}
	out := make([]ReportRef, v)
	next := snapshot
	for i := len(out) - 1; i >= 0 && d.err == nil; i-- {
		gap := d.uvarint()
		if len(d.b) < 2 {
			d.fail("truncated node tag")
			return nil
		}
		tag := NodeTag(binary.LittleEndian.Uint16(d.b))
		d.b = d.b[2:]
		if (gap == 0 && i < len(out)-1) || gap >= next {
			d.fail("report indices repeated, past the snapshot or at 0")
			return nil
		}
		next -= gap
		out[i] = ReportRef{Index: next, Node: tag}
	}
	if d.err != nil {
		return nil
	}
	return out
}

func (d *decoder) string() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > MaxNode || n > uint64(len(d.b)) {
		d.fail("string too long or truncated")
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) id() RuleID {
	if len(d.b) < 8 {
		d.fail("truncated rule ID")
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return RuleID(v)
}

func (d *decoder) rate() float64 {
	if len(d.b) < 4 {
		d.fail("truncated rate")
		return 0
	}
	v := math.Float32frombits(binary.LittleEndian.Uint32(d.b))
	d.b = d.b[4:]
	if !(v >= 0) || math.IsInf(float64(v), 0) {
		d.fail("rate negative, NaN or infinite")
		return 0
	}
	return float64(v)
}
