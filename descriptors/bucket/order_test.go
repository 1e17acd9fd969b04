package bucket

import (
	"math"
	"testing"
	"time"
)

// TestStaleReadingsCountAsLast: readings reach a bucket out of order when
// callers read the clock before taking the shard lock. A reading older than the
// bucket's last one must count as the last one; moving Last back would refill
// the gap twice.
func TestStaleReadingsCountAsLast(t *testing.T) {
	cases := []struct {
		name     string
		readings []time.Duration // each followed by a check of the tokens
		want     []float64
	}{
		{"5s, 1s, 6s leave 6 tokens, not 10", []time.Duration{5 * time.Second, time.Second, 6 * time.Second}, []float64{5, 5, 6}},
		{"a stale reading refills nothing", []time.Duration{2 * time.Second, 0, 2 * time.Second}, []float64{2, 2, 2}},
		{"equal readings refill nothing", []time.Duration{3 * time.Second, 3 * time.Second}, []float64{3, 3}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			p := Params{Rate: 1, Size: 10}
			wt := InitialWeight(1)
			s := Full(0, wt)
			s.advance(&p, wt, 0)
			s.apply(&p, wt.W, Draw, 10)
			for i, at := range tc.readings {
				s.advance(&p, wt, int64(at))
				r := s.apply(&p, wt.W, Check, 0)
				if math.Abs(r.Tokens-tc.want[i]) > 1e-9 {
					t.Fatalf("after reading %v: %.9f tokens, want %v", at, r.Tokens, tc.want[i])
				}
			}
		})
	}
}

// TestOversizedWaitDrawIsRejectedAtOnce: a wait-policy draw larger than the
// bucket can never be served from it, so it is OVER_LIMIT at once and takes
// nothing, as x/time/rate rejects n > burst.
func TestOversizedWaitDrawIsRejectedAtOnce(t *testing.T) {
	p := Params{Rate: 1000, Size: 2, MaxWait: time.Second}
	wt := InitialWeight(1)
	s := Full(0, wt)
	r := s.apply(&p, wt.W, Draw, 3)
	if r.OK || r.Wait != 0 || s.Fill != 1 {
		t.Fatalf("draw of 3 from a 2-token wait bucket: %+v, fill %v", r, s.Fill)
	}
}
