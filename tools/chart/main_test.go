package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/*.svg from the current renderer")

// TestRenderGolden renders a time series from a real e2e run and compares it
// with the committed SVG, which must also be well-formed XML.
func TestRenderGolden(t *testing.T) {
	var out bytes.Buffer
	if err := run("testdata/scale-event.json", "-", &out); err != nil {
		t.Fatal(err)
	}
	dec := xml.NewDecoder(bytes.NewReader(out.Bytes()))
	paths := 0
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
		if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "path" {
			paths++
		}
	}
	// The instance count (area and line), four replicas, the limit and the
	// aggregate.
	if paths != 2+4+2 {
		t.Errorf("%d paths drawn, want 8", paths)
	}
	for _, want := range []string{"aggregate admitted", "global limit", "node4", "catalog: 2 → 4 instances", "passing instances"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the chart lacks %q", want)
		}
	}
	if strings.Contains(out.String(), "href") {
		t.Error("the chart references an external resource")
	}

	golden := "testdata/scale-event.svg"
	if *update {
		if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to create it)", err)
	}
	if !bytes.Equal(out.Bytes(), want) {
		t.Errorf("rendering differs from %s (run with -update if the change is intended)", golden)
	}
}

func TestRejectsBadInput(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, json, want string
	}{
		{"no bins", `{"bin_seconds": 0.2}`, "no bins"},
		{"zero bin width", `{"bin_seconds": 0, "t": [0], "limit": [1], "aggregate": [1], "replicas": [1]}`, "bin_seconds 0 is not positive"},
		{"short series", `{"bin_seconds": 1, "t": [0, 1], "limit": [1, 1], "aggregate": [1], "replicas": [1, 1]}`, "aggregate has 1 values for 2 bins"},
		{"short replica", `{"bin_seconds": 1, "t": [0], "limit": [1], "aggregate": [1], "replicas": [1], "per_replica": [{"name": "n1", "admitted": []}]}`, "per_replica n1 has 0 values for 1 bins"},
		{"unknown field", `{"bins": 3}`, `unknown field "bins"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := filepath.Join(t.TempDir(), "in.json")
			if err := os.WriteFile(in, []byte(tc.json), 0o644); err != nil {
				t.Fatal(err)
			}
			err := run(in, "-", io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("run: %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
