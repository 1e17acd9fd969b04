package source

import (
	"errors"
	"os"
	"path/filepath"
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

// TestLoadErrorsInFileOrder: a file that cannot be read is reported in its
// place among the others' errors, and a domain defined twice is judged only
// once every file could be read, as before the loader left descriptors.
func TestLoadErrorsInFileOrder(t *testing.T) {
	_, err := Load("testdata/bad.yaml", "/proc/self/mem")
	got := descriptors.Errors(err)
	if len(got) != 2 || got[0].Pos.File != "testdata/bad.yaml" || got[1].Pos.File != "/proc/self/mem" || !strings.Contains(got[1].Msg, "read") {
		t.Fatalf("errors out of file order: %v", err)
	}
	_, err = Load("testdata/does-not-exist", "testdata/dupdomain")
	if got := descriptors.Errors(err); len(got) != 1 || !strings.Contains(got[0].Msg, "stat") {
		t.Fatalf("want only the stat error while a path is missing, got %v", err)
	}
	if _, err := Load("testdata/dupdomain"); err == nil || !strings.Contains(err.Error(), "duplicate domain 'same'") {
		t.Fatalf("duplicate domain not reported: %v", err)
	}
}

// TestAllFilesReadsAsUpstream: with AllFiles, every file under the directory
// is read, in subdirectories too and whatever its name, as upstream's runtime
// loader reads RUNTIME_ROOT; names starting with a dot are skipped, dot
// directories (Kubernetes' ..data) included, and a symlink to a file counts.
func TestAllFilesReadsAsUpstream(t *testing.T) {
	dir := t.TempDir()
	write := func(name, domain string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("domain: "+domain+"\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.yaml", "a")
	write("config", "b") // no extension, as a ConfigMap key may be
	write("sub/c.conf", "c")
	write("sub/deeper/d.yml", "d")
	write(".hidden.yaml", "hidden")
	write("..data/e.yaml", "e") // what the symlink below points into
	if err := os.Symlink("..data/e.yaml", filepath.Join(dir, "e.yaml")); err != nil {
		t.Fatal(err)
	}
	set, err := LoadWith(Options{AllFiles: true}, dir)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range set.Domains() {
		got = append(got, d.Name())
	}
	if strings.Join(got, ",") != "a,b,c,d,e" {
		t.Fatalf("domains %v, want a,b,c,d,e", got)
	}
	set, err = Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(set.Domains()); n != 2 {
		t.Fatalf("without AllFiles: %d domains, want 2 (a.yaml and e.yaml)", n)
	}
}

// TestAllFilesThroughSymlinkedRoot: a config directory that is itself a
// symlink is read through it, in both modes, and its files keep the path the
// operator gave.
func TestAllFilesThroughSymlinkedRoot(t *testing.T) {
	real := t.TempDir()
	if err := os.WriteFile(filepath.Join(real, "a.yaml"), []byte("domain: a\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(t.TempDir(), "config")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	for _, all := range []bool{false, true} {
		files, err := ListFiles(link, all)
		if err != nil || len(files) != 1 || files[0] != filepath.Join(link, "a.yaml") {
			t.Errorf("all=%v: %v %v, want [%s]", all, files, err, filepath.Join(link, "a.yaml"))
		}
	}
}
