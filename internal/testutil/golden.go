package testutil

import (
	"flag"
	"os"
	"testing"
)

var update = flag.Bool("update", false, "rewrite golden files in testdata/")

// Updating reports whether the test run was asked to rewrite its golden files
// (-update).
func Updating() bool { return *update }

// Golden compares got with the file at path, or rewrites the file with
// -update.
func Golden(t testing.TB, path, got string) {
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
