package demand

import (
	"bytes"
	"hash/crc32"
	"math"
	"os"
	"path/filepath"
	"testing"
)

func crc(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// FuzzDecode: no input crashes either decoder, and whatever decodes
// re-encodes to the same bytes (one encoding per value), and divides to
// shares that sum to at most L.
func FuzzDecode(f *testing.F) {
	r := sampleReport()
	sortRules(&r)
	rb, _ := AppendReport(nil, &r)
	p := sampleParams()
	pb, _ := AppendParams(nil, &p)
	f.Add(rb)
	f.Add(pb)
	f.Add([]byte(magic))
	for _, name := range []string{"params-v2.golden", "params.golden", "report.golden"} {
		if b, err := os.ReadFile(filepath.Join("testdata", name)); err == nil {
			f.Add(b)
		}
	}
	// Parameters listing reports at the edges: one at the snapshot, one
	// at index 1, tags 0 and 0xffff.
	edge := Params{Snapshot: 1 << 40, Units: 2, Reports: []ReportRef{{Index: 1, Node: 0}, {Index: 1 << 40, Node: 0xffff}},
		Rules: []RuleParams{{ID: 1, Limit: 10, K: 1, R: 0}}}
	eb, _ := AppendParams(nil, &edge)
	f.Add(eb)
	f.Fuzz(func(t *testing.T, b []byte) {
		// Half the inputs get a valid checksum, to reach past it.
		if len(b) > 4 && b[0]&1 == 1 {
			b = append(bytes.Clone(b[:len(b)-4]), le32(crc(b[:len(b)-4]))...)
		}
		if rep, err := DecodeReport(b); err == nil {
			again, err := AppendReport(nil, &rep)
			if err != nil || !bytes.Equal(again, b) {
				t.Fatalf("report %+v re-encodes to %x (%v), decoded from %x", rep, again, err, b)
			}
		}
		if par, err := DecodeParams(b); err == nil {
			if b[len(magic)] == legacyParams {
				// Read as dividing no report: every replica keeps at
				// most its equal share.
				if par.Reports != nil {
					t.Fatalf("version 2 parameters decoded with reports %v", par.Reports)
				}
				var h History
				h.Add(par.Snapshot, Report{})
				if _, s := h.Reported(&par, "n"); s != Absent {
					t.Fatalf("a replica under version 2 parameters: %v", s)
				}
			} else if again, err := AppendParams(nil, &par); err != nil || !bytes.Equal(again, b) {
				t.Fatalf("params %+v re-encode to %x (%v), decoded from %x", par, again, err, b)
			}
			for i := range par.Rules {
				rules := []Rule{par.Rule(&par.Rules[i])}
				for j := range par.Rules[i].Values {
					rules = append(rules, par.ValueRule(&par.Rules[i], &par.Rules[i].Values[j]))
				}
				// Any replica's share is at most L, whatever it claims.
				for _, rule := range rules {
					for _, d := range []float64{0, 1, rule.Limit, math.MaxFloat64} {
						if g, ok := Share(rule, 1, d, false, 1); ok && g > rule.Limit {
							t.Fatalf("share %v > L %v from %+v", g, rule.Limit, rule)
						}
					}
				}
			}
		}
	})
}

// FuzzDivide: for any snapshot the fuzzer finds, the shares sum to at most L.
func FuzzDivide(f *testing.F) {
	f.Add(120.0, uint32(3), 1000.0, 50.0, 10.0, 0.1, 0.1, uint8(0))
	f.Fuzz(func(t *testing.T, limit float64, view uint32, d0, d1, d2, h, fl float64, absent uint8) {
		view %= 1 << 20
		wants := []Want{
			{Units: 1, Offered: d0, Absent: absent&1 != 0},
			{Units: 2, Offered: d1, Absent: absent&2 != 0},
			{Units: 1, Offered: d2, Absent: absent&4 != 0},
		}
		p := Divide(limit, view, wants, h, fl)
		var sum float64
		for _, w := range wants {
			if g, ok := Share(p, w.Units, w.Offered, w.Absent, max(view, 4)); ok {
				sum += g
			}
		}
		if sum > 0 && sum > limit {
			t.Fatalf("shares sum to %v > L %v: %+v", sum, limit, p)
		}
	})
}
