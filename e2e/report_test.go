package e2e

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"strings"
	"testing"
	"text/tabwriter"
	"time"
)

const (
	// limit is L, the global limit of generic_key=cluster in requests per
	// second. A 4-second window counts 800 admissions, so ±5% is forty
	// requests, far above the few tokens that sit in the buckets at either end
	// of a window. It is kept this low because on a small virtual machine a
	// gRPC call costs the client and the daemon each up to a millisecond of
	// CPU at these rates (every call wakes both from idle), so the offered 2L
	// already keeps most of a core busy; a test that wants more CPU than the
	// machine gives it falls behind its schedule.
	limit = 200
	// tolerance is the contract: measured aggregates within ±5%.
	tolerance = 0.05
	// timeSeriesEnv names the file the scale-up test writes its time series to.
	timeSeriesEnv = "SHARELIMIT_E2E_TIMESERIES"
)

// within reports whether got is within ±tolerance of want.
func within(got, want float64) bool { return math.Abs(got-want) <= tolerance*want }

// dev is got's deviation from want, as a signed percentage.
func dev(got, want float64) string { return fmt.Sprintf("%+.1f%%", 100*(got-want)/want) }

// table is a printed table of what a scenario measured.
type table struct {
	title string
	rows  [][]string
}

func newTable(title string, header ...string) *table {
	return &table{title: title, rows: [][]string{header}}
}

func (tb *table) add(cells ...any) {
	row := make([]string, len(cells))
	for i, c := range cells {
		switch v := c.(type) {
		case float64:
			row[i] = fmt.Sprintf("%.1f", v)
		case time.Duration:
			row[i] = v.Round(time.Millisecond).String()
		default:
			row[i] = fmt.Sprint(v)
		}
	}
	tb.rows = append(tb.rows, row)
}

func (tb *table) log(t *testing.T) {
	t.Helper()
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, r := range tb.rows {
		fmt.Fprintln(tw, strings.Join(r, "\t")+"\t")
	}
	tw.Flush()
	t.Logf("%s\n%s", tb.title, b.String())
}

// timeSeries is one run as tools/chart reads it: per bin, the admitted rate
// of every replica and of all together, the limit, and the number of passing
// instances in the catalog. Rates are in requests per second.
type timeSeries struct {
	Title      string          `json:"title"`
	BinSeconds float64         `json:"bin_seconds"`
	Offered    float64         `json:"offered"`
	T          []float64       `json:"t"` // start of each bin, seconds since the load started
	Limit      []float64       `json:"limit"`
	Aggregate  []float64       `json:"aggregate"`
	Replicas   []int           `json:"replicas"` // in force at the middle of each bin
	PerReplica []replicaSeries `json:"per_replica"`
	Events     []event         `json:"events"`
}

type replicaSeries struct {
	Name     string    `json:"name"`
	Admitted []float64 `json:"admitted"`
}

type event struct {
	T     float64 `json:"t"`
	Label string  `json:"label"`
}

// step is a value that holds from time at on, until the next step.
type step struct {
	at time.Duration
	n  int
}

// series turns the daemons' accounting into a time series of bins of width
// w (a multiple of the accounting slot) from the load's start up to end.
// replicas lists the catalog's instance count as steps.
func (l *load) series(title string, w, end time.Duration, names []string, lim float64, replicas []step, events []event) *timeSeries {
	ts := &timeSeries{Title: title, BinSeconds: w.Seconds(), Offered: l.rate, Events: events}
	var bins []window
	for at := l.window(0, w).from; at+w <= end; at += w {
		bins = append(bins, window{at, at + w})
	}
	for slot, name := range names {
		rs := replicaSeries{Name: name, Admitted: make([]float64, len(bins))}
		for i, b := range bins {
			rs.Admitted[i] = l.admitted(b, slot)
		}
		ts.PerReplica = append(ts.PerReplica, rs)
	}
	for i, b := range bins {
		at := b.from
		ts.T = append(ts.T, at.Seconds())
		ts.Limit = append(ts.Limit, lim)
		sum := 0.0
		for _, rs := range ts.PerReplica {
			sum += rs.Admitted[i]
		}
		ts.Aggregate = append(ts.Aggregate, sum)
		// The count in force at the middle of the bin: a change a moment
		// after a bin starts belongs to that bin.
		count := 0
		for _, s := range replicas {
			if s.at <= at+w/2 {
				count = s.n
			}
		}
		ts.Replicas = append(ts.Replicas, count)
	}
	return ts
}

// writeIfAsked writes ts as JSON to $SHARELIMIT_E2E_TIMESERIES, if set.
func (ts *timeSeries) writeIfAsked(t *testing.T) {
	t.Helper()
	path := os.Getenv(timeSeriesEnv)
	if path == "" {
		return
	}
	b, err := json.MarshalIndent(ts, "", "  ")
	if err != nil {
		t.Fatalf("encode time series: %v", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
		t.Fatalf("write time series: %v", err)
	}
	t.Logf("time series written to %s", path)
}
