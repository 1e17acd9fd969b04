package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// What the baseline masks, and why each is safe to mask. Everything else is
// recorded exactly.
//
//   - Durations until reset, and the reset header, are rounded up to a whole
//     minute. A bucket refills while the script runs, so a duration reads a
//     little under its exact figure (3599.9995s for 3600s); the rules make
//     every exact figure a whole number of minutes (testdata/baseline/rules),
//     so rounding up gives it back unless the script stalls for a minute.
//   - Timestamps, ages ("just now", "3 s ago"), the accounting's slot numbers
//     and the history's partial step say when, not what.
//   - The accounting's and the history's per-slot arrays are summed: which
//     slot a decision falls in depends on when it was sent; how many there
//     were does not. Likewise the sparklines' drawing, whose totals (in their
//     labels and data-total) are kept.
//   - Timings (histograms and summaries: request latency) keep their count
//     and buckets' bounds, not their observations; go_ and process_ series
//     describe the Go process and keep only their names and types.

// timestamp is an RFC 3339 time; the zero time ("never") is kept.
var timestamp = regexp.MustCompile(`\b(?:000[1-9]|00[1-9]\d|0[1-9]\d\d|[1-9]\d{3})-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)`)

var (
	agoText   = regexp.MustCompile(`\bjust now\b|\b\d[\d.,]*\s?(?:ns|µs|ms|s|min|m|h|d|days?|hours?|minutes?|seconds?)(?: \d[\d.,]*\s?(?:ns|µs|ms|s|min|m|h|d))* ago\b`)
	svgDrawn  = regexp.MustCompile(`\b(d|points)="[^"]*"`)
	zeroTime  = "0001-01-01T00:00:00Z"
	maskedNow = "<time>"
)

// maskText masks a text or HTML page: timestamps, ages and the sparklines'
// paths.
func maskText(_ *testing.T, s string) string {
	s = timestamp.ReplaceAllStringFunc(s, func(m string) string {
		if m == zeroTime {
			return m
		}
		return maskedNow
	})
	s = agoText.ReplaceAllString(s, "<ago>")
	return svgDrawn.ReplaceAllString(s, `$1="<drawn>"`)
}

// maskJSON masks a JSON page (see maskValue) and prints it indented with
// sorted keys.
func maskJSON(t *testing.T, s string) string { return normalJSON(t, []byte(s), maskValue) }

// timeKeys are JSON fields that measure time, or count slots of it: masked.
var timeKeys = map[string]bool{
	"age_seconds": true, "partial_seconds": true, "first_slot": true, "from": true,
	"elapsed_seconds": true, "ends_in_seconds": true, "in_secs": true, "params_age_seconds": true,
}

// slotArrays are the per-slot counts of the accounting and the history:
// summed.
var slotArrays = map[string]bool{"admitted": true, "over_limit": true, "shadow_over_limit": true}

// maskValue masks one JSON value under key, in place of the original.
func maskValue(key string, v any) any {
	switch x := v.(type) {
	case string:
		if x != zeroTime && timestamp.MatchString(x) {
			return maskedNow
		}
	case json.Number:
		if timeKeys[key] {
			return "<masked>"
		}
	case []any:
		if slotArrays[key] {
			var sum int64
			for _, e := range x {
				n, ok := e.(json.Number)
				if !ok {
					return v
				}
				i, err := n.Int64()
				if err != nil {
					return v
				}
				sum += i
			}
			return fmt.Sprintf("<slots summed: %d>", sum)
		}
		if key == "share" { // the history's share per slot: each change once
			return slices.CompactFunc(x, func(a, b any) bool { return fmt.Sprint(a) == fmt.Sprint(b) })
		}
	}
	return v
}

// maskAnswer masks a rate-limit answer: durations and the reset header
// rounded up to a whole minute.
func maskAnswer(key string, v any) any {
	switch x := v.(type) {
	case string:
		if key == "durationUntilReset" || key == "duration_until_reset" {
			if secs, err := strconv.ParseFloat(strings.TrimSuffix(x, "s"), 64); err == nil {
				return fmt.Sprintf("~%ds", upToMinute(secs))
			}
		}
	case map[string]any:
		// A header {key, value}: the reset header's value is in seconds.
		if k, ok := x["key"].(string); ok && strings.HasSuffix(strings.ToLower(k), "-reset") {
			if secs, err := strconv.ParseFloat(fmt.Sprint(x["value"]), 64); err == nil {
				x["value"] = fmt.Sprintf("~%d", upToMinute(secs))
			}
		}
	}
	return v
}

// upToMinute rounds a positive span up to a whole minute, in seconds.
func upToMinute(secs float64) int64 { return int64(math.Ceil(secs/60)) * 60 }

// normalJSON decodes JSON (numbers kept as written), applies mask to every
// value, children first, and prints it indented with sorted keys.
func normalJSON(t *testing.T, data []byte, mask func(key string, v any) any) string {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decode JSON: %v\n%s", err, data)
	}
	var walk func(key string, v any) any
	walk = func(key string, v any) any {
		switch x := v.(type) {
		case map[string]any:
			for k, e := range x {
				x[k] = walk(k, e)
			}
		case []any:
			for i, e := range x {
				x[i] = walk(key, e)
			}
		}
		if mask != nil {
			return mask(key, v)
		}
		return v
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(walk("", v)); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// answerJSON is a message as protojson writes it, masked (maskAnswer),
// indented, keys sorted: protojson's own spacing is unstable on purpose.
func answerJSON(t *testing.T, m proto.Message) string {
	t.Helper()
	data, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return normalJSON(t, data, maskAnswer) + "\n"
}

// compactJSON is a message on one line, keys sorted.
func compactJSON(t *testing.T, m proto.Message) string {
	t.Helper()
	data, err := protojson.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := json.Compact(&b, []byte(normalJSON(t, data, nil))); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// baselineSeries prints one metric family: its help and type, then each
// series with its labels sorted, the series sorted. Figures that measure
// time are masked: timestamps and ages when not zero, and the observations
// of histograms and summaries (their count and bucket bounds are kept); the
// go_ and process_ families keep only their help and type.
func baselineSeries(f *dto.MetricFamily) string {
	var b strings.Builder
	name := f.GetName()
	fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, f.GetHelp(), name, strings.ToLower(f.GetType().String()))
	if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
		fmt.Fprintf(&b, "%s (values not recorded: they describe the Go process)\n", name)
		return b.String()
	}
	timeOf := strings.Contains(name, "timestamp") || strings.HasSuffix(name, "_age_seconds")
	var lines []string
	for _, m := range f.GetMetric() {
		var labels []string
		for _, l := range m.GetLabel() {
			labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
		}
		slices.Sort(labels)
		series := name + "{" + strings.Join(labels, ",") + "}"
		switch f.GetType() {
		case dto.MetricType_COUNTER:
			lines = append(lines, series+" "+figure(m.GetCounter().GetValue(), timeOf))
		case dto.MetricType_GAUGE:
			lines = append(lines, series+" "+figure(m.GetGauge().GetValue(), timeOf))
		case dto.MetricType_UNTYPED:
			lines = append(lines, series+" "+figure(m.GetUntyped().GetValue(), timeOf))
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			h := m.GetHistogram()
			var bounds []string
			for _, bk := range h.GetBucket() {
				bounds = append(bounds, strconv.FormatFloat(bk.GetUpperBound(), 'g', -1, 64))
			}
			lines = append(lines, fmt.Sprintf("%s count=%d buckets=[%s] (observations masked)", series, h.GetSampleCount(), strings.Join(bounds, " ")))
		case dto.MetricType_SUMMARY:
			lines = append(lines, fmt.Sprintf("%s count=%d (observations masked)", series, m.GetSummary().GetSampleCount()))
		}
	}
	slices.Sort(lines)
	for _, l := range lines {
		b.WriteString(l + "\n")
	}
	return b.String()
}

// figure is a sample's value, or <time> for a time that is not zero.
func figure(v float64, timeOf bool) string {
	if timeOf && v != 0 {
		return maskedNow
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
