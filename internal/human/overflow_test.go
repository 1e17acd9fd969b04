package human

import (
	"strings"
	"testing"
)

// Past 2^64 the conversion to uint64 in Number wraps (on amd64 to 2^63):
// a larger figure reads as a smaller, precise-looking one.
func TestNumberHuge(t *testing.T) {
	for _, v := range []float64{2e19, 1e20, 1e30} {
		if got := Number(v); strings.HasPrefix(got, "9,223,372,036,854,775,808") {
			t.Errorf("Number(%g) = %q", v, got)
		}
	}
	// Rates come to it from other replicas' demand reports (division table).
	if got := Rate(1e20, "second"); strings.HasPrefix(got, "9,223,372,036,854,775,808") {
		t.Errorf("Rate(1e20/s) = %q", got)
	}
}

// Converting seconds to a Duration by multiplying wraps past about 292 years,
// and a very old age read as "0.0 s".
func TestSecondsOverflow(t *testing.T) {
	if got := Seconds(1e10); got != "over 100 years" {
		t.Errorf("an age of 1e10 s reads %q", got)
	}
}
