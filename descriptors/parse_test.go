package descriptors

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

// golden compares got with the file at path, or rewrites it with -update.
func golden(t *testing.T, path, got string) {
	t.Helper()
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden (run with -update to create it): %v", err)
	}
	if got != string(want) {
		t.Errorf("%s differs.\n--- got:\n%s\n--- want:\n%s", path, got, want)
	}
}

func TestParseInvalid(t *testing.T) {
	files, _ := filepath.Glob("testdata/invalid/*.yaml")
	if len(files) < 20 {
		t.Fatalf("only %d invalid fixtures found", len(files))
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			set, err := LoadPaths(f)
			if err == nil {
				t.Fatalf("loaded without error:\n%s", set.Dump())
			}
			errs := Errors(err)
			if len(errs) == 0 {
				t.Fatalf("error carries no position: %v", err)
			}
			for _, e := range errs {
				if e.Pos.File != f || e.Pos.Line < 1 || e.Pos.Col < 1 {
					t.Errorf("bad position %v in %q", e.Pos, e)
				}
			}
			golden(t, strings.TrimSuffix(f, ".yaml")+".err", err.Error()+"\n")
		})
	}
}

func TestParseValid(t *testing.T) {
	files, _ := filepath.Glob("testdata/valid/*.yaml")
	if len(files) < 3 {
		t.Fatalf("only %d valid fixtures found", len(files))
	}
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".yaml")
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			set, err := LoadPaths(f)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, strings.TrimSuffix(f, ".yaml")+".golden", set.Dump())
		})
	}
}

func TestLoadDir(t *testing.T) {
	set, err := LoadPaths("testdata/dir")
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Domains) != 2 || set.Domains["one"] == nil || set.Domains["two"] == nil {
		t.Fatalf("want domains one and two (dotfile, .txt and directory skipped), got %v", set.Files)
	}
}

func TestDuplicateDomainAcrossFiles(t *testing.T) {
	_, err := LoadPaths("testdata/dupdomain")
	if err == nil {
		t.Fatal("duplicate domain accepted")
	}
	golden(t, "testdata/dupdomain.err", err.Error()+"\n")
}

func TestLoadMissing(t *testing.T) {
	_, err := LoadPaths("testdata/does-not-exist")
	var e *Error
	if !errors.As(err, &e) || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("want a positioned not-found error, got %v", err)
	}
}

func TestParseNumbersAsStrings(t *testing.T) {
	set, err := Parse("s.yaml", strings.NewReader(`
domain: d
descriptors:
  - key: a
    rate_limit: {unit: second, requests_per_unit: "25", unit_multiplier: "2", burst: "7"}
`))
	if err != nil {
		t.Fatal(err)
	}
	l := set.Rules[0].Limit
	if l.RequestsPerUnit != 25 || l.UnitMultiplier != 2 || l.Burst != 7 {
		t.Fatalf("got %+v", l)
	}
	if l.Params.Rate != 12.5 || l.Params.Size != 7 {
		t.Fatalf("params %+v", l.Params)
	}
}

func TestUnitsCaseInsensitive(t *testing.T) {
	for _, u := range []string{"second", "MINUTE", "Hour", "day", "week", "month", "year"} {
		set, err := Parse("u.yaml", strings.NewReader("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: "+u+", requests_per_unit: 1}\n"))
		if err != nil {
			t.Fatalf("%s: %v", u, err)
		}
		if got := set.Rules[0].Limit.Unit.String(); got != strings.ToLower(u) {
			t.Errorf("%s parsed as %s", u, got)
		}
	}
	if Month.Duration() != 30*24*60*60*1e9 || Year.Duration() != 365*24*60*60*1e9 {
		t.Error("month is 30 days and year 365, as upstream")
	}
}

func TestDomainKeyAfterDescriptors(t *testing.T) {
	set, err := Parse("late.yaml", strings.NewReader("descriptors:\n  - key: a\n    rate_limit: {unit: second, requests_per_unit: 1}\ndomain: late\n"))
	if err != nil {
		t.Fatal(err)
	}
	if r := set.Rules[0]; r.Path != "late.a" || r.Domain != "late" {
		t.Fatalf("path %q domain %q", r.Path, r.Domain)
	}
}
