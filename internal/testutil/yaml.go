package testutil

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// ConfigFile is one rules file read for a test: its path and its bytes.
type ConfigFile struct {
	Name string
	Data []byte
}

// ReadConfig reads rules files as the file source does, without importing
// it: each path that is a file, and the *.yaml and *.yml files directly in
// each path that is a directory (dotfiles skipped, in name order). Packages
// the source imports (descriptors, its engine) test on rules read this way.
func ReadConfig(t testing.TB, paths ...string) []ConfigFile {
	t.Helper()
	var files []ConfigFile
	for _, p := range paths {
		names := []string{p}
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			names = nil
			ents, err := os.ReadDir(p)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range ents {
				ext := strings.ToLower(filepath.Ext(e.Name()))
				if !strings.HasPrefix(e.Name(), ".") && (ext == ".yaml" || ext == ".yml") {
					names = append(names, filepath.Join(p, e.Name()))
				}
			}
			sort.Strings(names)
		}
		for _, n := range names {
			data, err := os.ReadFile(n)
			if err != nil {
				t.Fatal(err)
			}
			files = append(files, ConfigFile{Name: n, Data: data})
		}
	}
	return files
}
