package descriptors

import (
	"testing"

	"github.com/sharelimit/sharelimit/internal/testutil"
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
	for _, f := range testutil.ReadConfig(t, paths...) {
		files = append(files, File{Name: f.Name, Data: f.Data})
	}
	return CompileWith(opts, files...)
}
