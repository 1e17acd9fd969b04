package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sync"
	"testing"
)

// builds holds, per import path, the sync.OnceValues that builds it.
var builds sync.Map

// buildDir is the one directory every Build of this process writes into,
// made by the first.
var buildDir struct {
	once sync.Once
	path string
	err  error
}

// Build compiles the command whose import path is pkg, once per test binary,
// and returns the path of the executable, failing t if it does not build.
// Tests that call it at the same time share the one build. It builds without
// the race detector: the command is the system under test, not the test. A
// package whose tests call Build removes the binaries after its tests with
// RemoveBuilds in TestMain.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	bin, err := Binary(pkg)
	if err != nil {
		t.Fatal(err)
	}
	return bin
}

// Binary is Build for a caller with no test to fail: it returns the build's
// error instead.
func Binary(pkg string) (string, error) {
	once, _ := builds.LoadOrStore(pkg, sync.OnceValues(func() (string, error) { return build(pkg) }))
	return once.(func() (string, error))()
}

func build(pkg string) (string, error) {
	buildDir.once.Do(func() { buildDir.path, buildDir.err = os.MkdirTemp("", "sharelimit-test-bin-") })
	if buildDir.err != nil {
		return "", fmt.Errorf("build %s: %w", pkg, buildDir.err)
	}
	// One directory per package keeps the command's own name and still
	// lets two commands of the same name be built.
	dir, err := os.MkdirTemp(buildDir.path, "")
	if err != nil {
		return "", fmt.Errorf("build %s: %w", pkg, err)
	}
	bin := filepath.Join(dir, path.Base(pkg))
	cmd := exec.Command("go", "build", "-o", bin, pkg)
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("build %s: %w\n%s", pkg, err, out)
	}
	return bin, nil
}

// RemoveBuilds deletes what Build wrote. TestMain calls it once the tests
// have run; it does nothing when nothing was built.
func RemoveBuilds() {
	buildDir.once.Do(func() {}) // nothing built: nothing to remove, and no build after this
	if buildDir.path != "" {
		os.RemoveAll(buildDir.path)
	}
}
