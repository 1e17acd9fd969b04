package descriptors

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
)

// FuzzParse feeds arbitrary bytes to the parser: it must never panic, and every
// error must carry a position in the file.
func FuzzParse(f *testing.F) {
	for _, dir := range []string{"testdata/valid", "testdata/invalid"} {
		files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
		for _, p := range files {
			if b, err := os.ReadFile(p); err == nil {
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := Parse("fuzz.yaml", bytes.NewReader(data))
		if err != nil {
			errs := Errors(err)
			if len(errs) == 0 {
				t.Fatalf("error without a position: %v", err)
			}
			for _, e := range errs {
				if e.Pos.File != "fuzz.yaml" || e.Pos.Line < 1 || e.Pos.Col < 1 {
					t.Fatalf("bad position %v: %v", e.Pos, e)
				}
			}
			return
		}
		_ = set.Dump()
	})
}
