// Package human formats the figures the admin pages and the CLI show to a
// person: rates in a limit's own unit with a few significant digits, ages,
// counts, and lists of names. It exists because the raw float formatting the machine-readable
// outputs use ("5.78704e-05") is what an operator reads at 3 a.m., and every
// human-facing output should say the same figure the same way.
//
// The package knows the units of upstream's YAML by name only, so that the
// descriptors package could use it too without an import cycle. It must never
// be used for what a machine reads (/metrics, /json, the wire): those keep
// their exact figures.
package human

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// units are the units of upstream's YAML, smallest first, with their
// length in seconds (a month is 30 days and a year 365, as upstream).
var units = []struct {
	name string
	secs float64
}{
	{"second", 1}, {"minute", 60}, {"hour", 3600}, {"day", 86400},
	{"week", 7 * 86400}, {"month", 30 * 86400}, {"year", 365 * 86400},
}

// smallest is the least figure worth showing in a unit: below it, a rate
// moves up to the next larger unit, where it reads as a number a person can
// hold ("0.0001 per second" is "8.64 per day").
const smallest = 0.01

// Rate formats perSecond, a rate in requests per second, in unit (a name of
// upstream's YAML, any case; an unknown one means second): "16.7 per
// second", "1.67 per day". A rate too small to read in its own unit moves to
// the first larger unit where it reaches 1 (or to a year, the largest).
// Zero is "0 per <unit>"; a negative, NaN or infinite rate is shown as Go
// formats it, since it means a bug upstream of the page, not traffic.
func Rate(perSecond float64, unit string) string {
	i := unitIndex(unit)
	if math.IsNaN(perSecond) || math.IsInf(perSecond, 0) || perSecond < 0 {
		return strconv.FormatFloat(perSecond, 'g', 6, 64) + " per " + units[i].name
	}
	v := perSecond * units[i].secs
	if v != 0 && v < smallest {
		for i+1 < len(units) {
			i++
			if v = perSecond * units[i].secs; v >= 1 {
				break
			}
		}
	}
	return Number(v) + " per " + units[i].name
}

func unitIndex(unit string) int {
	for i, u := range units {
		if strings.EqualFold(u.name, unit) {
			return i
		}
	}
	return 0
}

// Number formats a non-negative figure with three significant digits and no
// exponent: "0.0167", "1.67", "16.7", "167", and whole numbers with thousands
// separators from 1,000 on ("1,235", "4,294,967,295"). Below 0.001 it says
// "under 0.001"; that is the only figure that loses its digits, and Rate moves
// such rates to a larger unit first.
func Number(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0) || v < 0:
		return strconv.FormatFloat(v, 'g', 6, 64)
	case v == 0:
		return "0"
	case v < 0.001:
		return "under 0.001"
	case v >= 1e18:
		// Past what a count holds exactly (and past 2^64, which a uint64
		// would wrap): three digits and an exponent.
		return strconv.FormatFloat(v, 'g', 3, 64)
	case v >= 999.5:
		return Count(uint64(math.Round(v)))
	}
	// Three significant digits, written out in full: FormatFloat's 'g'
	// would switch to an exponent for small values.
	digits := 2 - int(math.Floor(math.Log10(v)))
	s := strconv.FormatFloat(v, 'f', max(digits, 0), 64)
	// Rounding can carry into a new digit (9.996 -> "10.00"): redo it with
	// one digit fewer.
	if r, _ := strconv.ParseFloat(s, 64); r >= math.Pow10(3-digits) && digits > 0 {
		s = strconv.FormatFloat(v, 'f', digits-1, 64)
	}
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// Count formats n with thousands separators: "1,234,567".
func Count(n uint64) string {
	s := strconv.FormatUint(n, 10)
	if len(s) <= 3 {
		return s
	}
	var b strings.Builder
	lead := len(s) % 3
	if lead > 0 {
		b.WriteString(s[:lead])
	}
	for i := lead; i < len(s); i += 3 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s[i : i+3])
	}
	return b.String()
}

// Share formats a weight (a replica's share of a limit, 0 to 1) as a
// percentage with three significant digits: "33.3%", "0.00579%".
func Share(w float64) string {
	if w <= 0 || math.IsNaN(w) {
		return "0%"
	}
	p := w * 100
	if p < 0.001 {
		return strconv.FormatFloat(p, 'g', 3, 64) + "%"
	}
	return Number(p) + "%"
}

// Duration formats a non-negative span coarsely, as a person says it:
// "0.4 s", "3 s", "2 min 5 s", "3 h 20 min", "4 days 2 h".
func Duration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	s := d.Seconds()
	switch {
	case d < time.Second:
		// Tenths below a second: a held change "in 0.4 s" is not "in 0 s".
		return strconv.FormatFloat(math.Floor(s*10)/10, 'f', 1, 64) + " s"
	case d < time.Minute:
		return strconv.FormatInt(int64(s), 10) + " s"
	case d < time.Hour:
		return pair(int64(d/time.Minute), "min", int64(d%time.Minute/time.Second), "s")
	case d < 48*time.Hour:
		return pair(int64(d/time.Hour), "h", int64(d%time.Hour/time.Minute), "min")
	}
	return pair(int64(d/(24*time.Hour)), "days", int64(d%(24*time.Hour)/time.Hour), "h")
}

func pair(a int64, au string, b int64, bu string) string {
	s := strconv.FormatInt(a, 10) + " " + au
	if b > 0 {
		s += " " + strconv.FormatInt(b, 10) + " " + bu
	}
	return s
}

// Ago says how long ago t was, seen at now: "3 s ago", or "never" for the
// zero time. A t after now (clocks of two machines) reads "just now".
func Ago(t, now time.Time) string {
	if t.IsZero() {
		return "never"
	}
	d := now.Sub(t)
	if d < time.Second {
		return "just now"
	}
	return Duration(d) + " ago"
}

// AgoSeconds is Ago for an age already in seconds; never says whether there
// was anything to age at all.
func AgoSeconds(secs float64, never bool) string {
	if never {
		return "never"
	}
	if secs < 1 {
		return "just now"
	}
	return Seconds(secs) + " ago"
}

// Seconds is Duration for a span given in seconds, which may be past what a
// time.Duration holds (about 292 years; a timestamp from another machine can
// be anything): such a span reads "over 100 years", never a wrapped one.
func Seconds(secs float64) string {
	if math.IsNaN(secs) {
		return "unknown"
	}
	if secs >= 100*365*24*3600 {
		return "over 100 years"
	}
	return Duration(time.Duration(secs * float64(time.Second)))
}
