package source

import (
	"errors"
	"strings"
	"testing"

	"github.com/sharelimit/sharelimit/descriptors"
)

func TestLoadDir(t *testing.T) {
	set, err := Load("testdata/dir")
	if err != nil {
		t.Fatal(err)
	}
	if len(set.Domains()) != 2 || set.Domain("one") == nil || set.Domain("two") == nil {
		t.Fatalf("want domains one and two (dotfile, .txt and directory skipped), got %v", set.Files())
	}
}

func TestLoadMissing(t *testing.T) {
	_, err := Load("testdata/does-not-exist")
	var e *descriptors.Error
	if !errors.As(err, &e) || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("want a positioned not-found error, got %v", err)
	}
}

// TestLoadReportsEveryFile: errors of every file come back together, each
// with its own file:line:col, and a good file does not hide a bad one.
func TestLoadReportsEveryFile(t *testing.T) {
	_, err := Load("testdata/dir/one.yaml", "testdata/bad.yaml", "testdata/does-not-exist.yaml")
	got := descriptors.Errors(err)
	if len(got) != 2 || got[0].Pos.File != "testdata/does-not-exist.yaml" || got[1].Pos.File != "testdata/bad.yaml" || got[1].Pos.Line != 4 {
		t.Fatalf("errors %v", err)
	}
}
