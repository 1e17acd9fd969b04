package demand

import (
	"bytes"
	"errors"
	"flag"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata")

func sampleReport() Report {
	return Report{
		Seq: 42, At: 1_780_000_000_123_456_789, Units: 3, Node: "node-a.dc1",
		Rules: []RuleDemand{
			{ID: 7, Offered: 312.5, Admitted: 100, Values: []ValueDemand{{ID: 3, Offered: 300, Admitted: 90}, {ID: 1 << 60, Offered: 0, Admitted: 0}}},
			{ID: RuleIDOf("edge/generic_key_cluster"), Offered: 0.25, Admitted: 0},
		},
	}
}

func sampleParams() Params {
	return Params{
		At: 1_780_000_001_000_000_000, Snapshot: 9001, Units: 4, Headroom: 0.1, Floor: 0.1, Leader: "node-b",
		Reports: []ReportRef{{Index: 8990, Node: TagOf("node-a")}, {Index: 8999, Node: TagOf("node-b")}, {Index: 9001, Node: TagOf("node-c")}},
		Rules:   []RuleParams{{ID: 7, Limit: 400, K: 0.25, R: 0.0625, Admitted: 399.5, Values: []ValueParams{{ID: 3, K: 0.5, R: 0.125, Admitted: 380}}}},
	}
}

func sortRules(r *Report) {
	if len(r.Rules) == 2 && r.Rules[0].ID > r.Rules[1].ID {
		r.Rules[0], r.Rules[1] = r.Rules[1], r.Rules[0]
	}
}

// TestCodecGolden pins the wire format: a change to it must bump the
// version, and the golden files show what changed.
func TestCodecGolden(t *testing.T) {
	r := sampleReport()
	sortRules(&r)
	rb, err := AppendReport(nil, &r)
	if err != nil {
		t.Fatal(err)
	}
	p := sampleParams()
	pb, err := AppendParams(nil, &p)
	if err != nil {
		t.Fatal(err)
	}
	for name, got := range map[string][]byte{"report.golden": rb, "params.golden": pb} {
		path := filepath.Join("testdata", name)
		if *update {
			if err := os.WriteFile(path, got, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		want, err := os.ReadFile(path)
		if err != nil {
			t.Fatalf("%v (run with -update to create it)", err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s: encoding changed:\n got %x\nwant %x", name, got, want)
		}
	}
	// A rule takes 8 bytes of ID, 4 per figure and a byte of value count;
	// a value 8 and 4 per figure; a report divided, 2 bytes of tag and its
	// index's gap to the one before (a byte while writes are near).
	if len(rb) > 100 || len(pb) > 84+3*3 {
		t.Errorf("a two-rule report with two values is %d bytes and a one-rule parameter set with one value and three reports %d: more than 100 and 93", len(rb), len(pb))
	}
}

// TestCodecReadsVersion2Params: parameters of the previous version (no list
// of the reports divided) decode with none listed, so every replica reads
// itself as not counted and keeps at most its equal share; reports of the
// previous version are refused.
func TestCodecReadsVersion2Params(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "params-v2.golden"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := DecodeParams(b)
	if err != nil {
		t.Fatalf("version 2 parameters: %v", err)
	}
	want := sampleParams()
	if p.Reports != nil || p.Snapshot != want.Snapshot || p.Units != want.Units || p.Leader != want.Leader || len(p.Rules) != 1 || !reflect.DeepEqual(p.Rules[0], want.Rules[0]) {
		t.Errorf("version 2 parameters decoded as %+v", p)
	}
	var h History
	h.Add(8990, Report{Seq: 1})
	if _, s := h.Reported(&p, "node-a"); s != Absent {
		t.Errorf("a replica under version 2 parameters: %v, want not counted", s)
	}
	r := sampleReport()
	sortRules(&r)
	rb, _ := AppendReport(nil, &r)
	rb[len(magic)] = legacyParams
	rb = append(rb[:len(rb)-4], le32(crc(rb[:len(rb)-4]))...)
	if _, err := DecodeReport(rb); !errors.Is(err, ErrFormat) {
		t.Errorf("a version 2 report: %v, want ErrFormat", err)
	}
}

// TestCodecReports: the reports a division lists round-trip; the encoder
// refuses them out of order, repeated, at 0 or past the snapshot, and the
// decoder refuses the same once resealed.
func TestCodecReports(t *testing.T) {
	for _, refs := range [][]ReportRef{
		{{Index: 5, Node: 1}, {Index: 5, Node: 2}},
		{{Index: 6, Node: 1}, {Index: 5, Node: 2}},
		{{Index: 0, Node: 1}},
		{{Index: 11, Node: 1}},
	} {
		p := Params{Snapshot: 10, Reports: refs}
		if _, err := AppendParams(nil, &p); !errors.Is(err, ErrFormat) {
			t.Errorf("reports %v at snapshot 10: %v, want ErrFormat", refs, err)
		}
	}
	p := Params{Snapshot: 10, Reports: []ReportRef{{Index: 1, Node: 7}, {Index: 2, Node: 7}, {Index: 10, Node: 0xffff}}}
	b, err := AppendParams(nil, &p)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeParams(b)
	if err != nil || !reflect.DeepEqual(got.Reports, p.Reports) {
		t.Fatalf("reports %+v (%v), want %+v", got.Reports, err, p.Reports)
	}
	// The body after at (1 byte) and snapshot (1 byte): count 3, then
	// gaps 0, 8 and 1, each with its tag. Rewrite a gap and reseal.
	gapAt := []int{len(magic) + 2 + 3, len(magic) + 2 + 6, len(magic) + 2 + 9}
	if b[gapAt[0]] != 0 || b[gapAt[1]] != 8 || b[gapAt[2]] != 1 {
		t.Fatalf("layout changed: %x", b)
	}
	for name, edit := range map[string]func(c []byte){
		"a repeated index":  func(c []byte) { c[gapAt[1]] = 0 },
		"an index of 0":     func(c []byte) { c[gapAt[2]] = 2 },
		"past the snapshot": func(c []byte) { c[gapAt[0]] = 11 },
		"more than the max": func(c []byte) { c[len(magic)+4] = 0x7f },
	} {
		c := bytes.Clone(b)
		edit(c)
		c = append(c[:len(c)-4], le32(crc(c[:len(c)-4]))...)
		if _, err := DecodeParams(c); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", name, err)
		}
	}
}

func TestCodecRoundTrip(t *testing.T) {
	r := sampleReport()
	sortRules(&r)
	b, err := AppendReport([]byte("prefix"), &r)
	if err != nil {
		t.Fatal(err)
	}
	got, err := DecodeReport(b[len("prefix"):])
	if err != nil {
		t.Fatal(err)
	}
	if got.Seq != r.Seq || got.At != r.At || got.Units != r.Units || got.Node != r.Node || len(got.Rules) != 2 {
		t.Fatalf("round trip: %+v, want %+v", got, r)
	}
	for i := range r.Rules {
		if !reflect.DeepEqual(got.Rules[i], r.Rules[i]) { // the sample's rates are exact in float32
			t.Errorf("rule %d: %+v, want %+v", i, got.Rules[i], r.Rules[i])
		}
	}
	if got.Find(7) == nil || got.Find(8) != nil {
		t.Errorf("Find: %v %v", got.Find(7), got.Find(8))
	}

	p := sampleParams()
	b, err = AppendParams(nil, &p)
	if err != nil {
		t.Fatal(err)
	}
	gp, err := DecodeParams(b)
	if err != nil {
		t.Fatal(err)
	}
	if gp.At != p.At || gp.Snapshot != p.Snapshot || !reflect.DeepEqual(gp.Reports, p.Reports) || gp.Units != p.Units || gp.Leader != p.Leader || len(gp.Rules) != 1 || !reflect.DeepEqual(gp.Rules[0], p.Rules[0]) {
		t.Errorf("round trip: %+v, want %+v", gp, p)
	}
	if math.Abs(gp.Headroom-0.1) > 1e-7 || gp.Headroom > 0.1 || gp.Floor > 0.1 {
		t.Errorf("headroom %v and floor %v: want 0.1 rounded toward zero", gp.Headroom, gp.Floor)
	}
}

// TestParamsRoundDown: K and R come out of the encoding no larger than they
// went in, whatever their float32 neighbours.
func TestParamsRoundDown(t *testing.T) {
	for _, v := range []float64{1.0 / 3, 0.1, 2.0 / 3, 0.999999999, 1e-30, 0.7} {
		p := Params{Units: 1, Rules: []RuleParams{{ID: 1, Limit: 1, K: v, R: v}}}
		b, err := AppendParams(nil, &p)
		if err != nil {
			t.Fatal(err)
		}
		got, err := DecodeParams(b)
		if err != nil {
			t.Fatal(err)
		}
		if k, r := got.Rules[0].K, got.Rules[0].R; k > v || r > v || v-k > 1e-7*v {
			t.Errorf("%v encoded as K=%v R=%v: want at most it, within float32", v, k, r)
		}
	}
}

func TestCodecRejects(t *testing.T) {
	r := sampleReport()
	sortRules(&r)
	good, _ := AppendReport(nil, &r)
	p := sampleParams()
	goodP, _ := AppendParams(nil, &p)
	flip := func(b []byte, i int) []byte {
		c := bytes.Clone(b)
		c[i] ^= 0x40
		return c
	}
	// reseal recomputes the checksum, to reach the checks behind it.
	reseal := func(body []byte) []byte {
		return append(bytes.Clone(body), le32(crc(body))...)
	}
	cases := map[string][]byte{
		"empty":            nil,
		"short":            good[:5],
		"truncated":        good[:len(good)-1],
		"bit flipped":      flip(good, 10),
		"checksum flipped": flip(good, len(good)-1),
		"params as report": goodP,
		"trailing bytes":   reseal(append(bytes.Clone(good[:len(good)-4]), 0)),
		"future version":   reseal(append(append([]byte(magic), version+1), good[4:len(good)-4]...)),
		"oversized":        make([]byte, MaxSize+1),
	}
	for name, b := range cases {
		if _, err := DecodeReport(b); !errors.Is(err, ErrFormat) {
			t.Errorf("%s: DecodeReport = %v, want ErrFormat", name, err)
		}
	}
	if _, err := DecodeParams(good); !errors.Is(err, ErrFormat) {
		t.Errorf("report as params: %v, want ErrFormat", err)
	}
	// Encoders refuse what the decoders would.
	bad := Report{Rules: []RuleDemand{{ID: 2}, {ID: 1}}}
	if _, err := AppendReport(nil, &bad); !errors.Is(err, ErrFormat) {
		t.Errorf("unsorted rules: %v", err)
	}
	long := Report{Node: string(make([]byte, MaxNode+1))}
	if _, err := AppendReport(nil, &long); !errors.Is(err, ErrFormat) {
		t.Errorf("long node: %v", err)
	}
	unsortedValues := Report{Rules: []RuleDemand{{ID: 1, Values: []ValueDemand{{ID: 5}, {ID: 5}}}}}
	if _, err := AppendReport(nil, &unsortedValues); !errors.Is(err, ErrFormat) {
		t.Errorf("duplicate values: %v", err)
	}
	// The largest legal report and parameter set fit MaxSize; one value
	// more is refused by the encoder.
	big := Report{Seq: math.MaxUint64, At: math.MinInt64, Units: math.MaxUint32, Node: string(make([]byte, MaxNode))}
	bigP := Params{At: math.MinInt64, Snapshot: math.MaxUint64, Units: math.MaxUint32, Leader: string(make([]byte, MaxNode))}
	for i := range MaxReports {
		// Gaps as large as they come: the first from the snapshot.
		bigP.Reports = append(bigP.Reports, ReportRef{Index: uint64(i+1) << 50, Node: NodeTag(i)})
	}
	bigP.Reports[0].Index = 1
	for i := range MaxRules {
		rd := RuleDemand{ID: RuleID(i), Offered: math.MaxFloat32, Admitted: 1}
		rp := RuleParams{ID: RuleID(i), Limit: math.MaxFloat32, K: 1, R: 1}
		for j := range MaxValues / MaxRules {
			rd.Values = append(rd.Values, ValueDemand{ID: math.MaxUint64 - uint64(MaxValues-j), Offered: math.MaxFloat32, Admitted: math.MaxFloat32})
			rp.Values = append(rp.Values, ValueParams{ID: math.MaxUint64 - uint64(MaxValues-j), K: 1, R: 1, Admitted: math.MaxFloat32})
		}
		big.Rules = append(big.Rules, rd)
		bigP.Rules = append(bigP.Rules, rp)
	}
	b, err := AppendReport(nil, &big)
	if err != nil || len(b) > MaxSize {
		t.Fatalf("largest report: %d bytes (max %d), %v", len(b), MaxSize, err)
	}
	if _, err := DecodeReport(b); err != nil {
		t.Errorf("largest report: %v", err)
	}
	if b, err = AppendParams(nil, &bigP); err != nil || len(b) > MaxSize {
		t.Fatalf("largest parameter set: %d bytes (max %d), %v", len(b), MaxSize, err)
	}
	if _, err := DecodeParams(b); err != nil {
		t.Errorf("largest parameter set: %v", err)
	}
	big.Rules[0].Values = append(big.Rules[0].Values, ValueDemand{ID: math.MaxUint64})
	if _, err := AppendReport(nil, &big); !errors.Is(err, ErrFormat) {
		t.Errorf("%d values: %v, want ErrFormat", MaxValues+1, err)
	}
}

func le32(v uint32) []byte { return []byte{byte(v), byte(v >> 8), byte(v >> 16), byte(v >> 24)} }
