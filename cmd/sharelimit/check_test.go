package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/source"
)

// TestCheckConfigAllFiles: with --config-all-files, check reads a directory
// as the daemon does in upstream's mode (every file, subdirectories too,
// dotfiles skipped), so an OWNERS file beside the rules fails it with the
// errors the daemon's start-up load reports; without the flag it reads only
// *.yaml and *.yml, as the daemon's default.
func TestCheckConfigAllFiles(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("rules.yaml", "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 5}\n")
	write("OWNERS", "# reviewers\nalice\nbob\n")
	write("sub/more", "domain: e\ndescriptors:\n  - key: k\n    rate_limit: {unlimited: true}\n")
	write(".hidden", "not: [yaml")

	code, out := runCLI("check", dir)
	if code != 0 || !strings.Contains(out, "ok: 1 files") {
		t.Fatalf("check DIR: exit %d:\n%s", code, out)
	}

	code, out = runCLI("check", "--config-all-files", dir)
	if code != 1 {
		t.Fatalf("check --config-all-files DIR: exit %d, want 1:\n%s", code, out)
	}
	owners := filepath.Join(dir, "OWNERS")
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	for _, l := range lines {
		if !strings.HasPrefix(l, owners+":") {
			t.Errorf("an error not about OWNERS, or without its path first: %q", l)
		}
	}
	// file:line:col, as the daemon reports it.
	errs := descriptors.Errors(loadAsDaemon(t, dir))
	if len(errs) == 0 || errs[0].Pos.File != owners || errs[0].Pos.Line < 1 || errs[0].Pos.Col < 1 {
		t.Fatalf("the daemon's load: %v", errs)
	}
	var want bytes.Buffer
	for _, e := range errs {
		want.WriteString(e.Error() + "\n")
	}
	if out != want.String() {
		t.Errorf("check says\n%s\nthe daemon's load says\n%s", out, want.String())
	}

	// Once OWNERS is gone, every other file counts, the one in sub/ too, and
	// the dotfile does not.
	if err := os.Remove(owners); err != nil {
		t.Fatal(err)
	}
	if code, out := runCLI("check", "--config-all-files", dir); code != 0 || !strings.Contains(out, "ok: 2 files, 2 domains") {
		t.Fatalf("check --config-all-files without OWNERS: exit %d:\n%s", code, out)
	}
}

// loadAsDaemon loads dir as the daemon does at start-up with
// --config-all-files: its file source's first load, with the same options.
func loadAsDaemon(t *testing.T, dir string) error {
	t.Helper()
	w := &source.Watcher{Dir: dir, Options: source.Options{AllFiles: true},
		Apply: func(*descriptors.Set) error { return nil }}
	err := w.Load()
	if err == nil {
		t.Fatal("the daemon's load accepted OWNERS")
	}
	return err
}
