// Command chart renders the time series that sharelimit's e2e scale-up test
// writes (set SHARELIMIT_E2E_TIMESERIES=path) as a self-contained SVG chart,
// with package internal/chart; see there for the input's JSON form.
//
// Why a command of its own: the chart is drawn after the run, from the file
// the run wrote, so it can be redrawn without running the cluster again. It
// holds no drawing of its own (that is internal/chart's), and it must never
// draw a series that does not decode strictly (an unknown field is an
// error) or that Series.Validate refuses.
//
//	SHARELIMIT_E2E_TIMESERIES=/tmp/scale-event.json go test -race -count=1 -run TestScaleUp ./e2e/
//	go run ./tools/chart -in /tmp/scale-event.json -out docs/scale-event.svg
package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/sharelimit/sharelimit/internal/chart"
)

func main() {
	in := flag.String("in", "", "time series JSON written by the e2e scale-up test (required)")
	out := flag.String("out", "-", "SVG file to write; - for standard output")
	flag.Parse()
	if *in == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: chart -in series.json [-out chart.svg]")
		os.Exit(2)
	}
	if err := run(*in, *out, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "chart:", err)
		os.Exit(1)
	}
}

func run(in, out string, stdout io.Writer) error {
	raw, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	var ts chart.Series
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&ts); err != nil {
		return fmt.Errorf("read %s: %w", in, err)
	}
	if err := ts.Validate(); err != nil {
		return fmt.Errorf("read %s: %w", in, err)
	}
	var b bytes.Buffer
	chart.Render(&b, &ts)
	if out == "-" {
		_, err = stdout.Write(b.Bytes())
		return err
	}
	return os.WriteFile(out, b.Bytes(), 0o644)
}
