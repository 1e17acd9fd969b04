package descriptors

import (
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
)

// compileFiles reads config files, and the *.yaml and *.yml files directly in
// directories, and compiles them: what the file source does, without
// importing it (the source imports this package).
func compileFiles(t testing.TB, paths ...string) (*Set, error) {
	t.Helper()
	return compileFilesWith(t, CompileOptions{}, paths...)
}

func compileFilesWith(t testing.TB, opts CompileOptions, paths ...string) (*Set, error) {
	t.Helper()
	var files []File
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
			files = append(files, File{Name: n, Data: data})
		}
	}
	return CompileWith(opts, files...)
}
