package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"github.com/fsnotify/fsnotify"
	"go.uber.org/goleak"

	"github.com/sharelimit/sharelimit/descriptors"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func rules(rpu int) string {
	return fmt.Sprintf("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requests_per_unit: %d}\n  - key: stable\n    rate_limit: {unit: hour, requests_per_unit: 2}\n", rpu)
}

// harness runs a Watcher over dir, installing into a real engine.
type harness struct {
	t       *testing.T
	w       *Watcher
	engine  *engine.Engine
	logs    testutil.Buffer
	done    chan error // Run's result
	mu      sync.Mutex
	loads   int
	fails   int
	lastErr error
}

func start(t *testing.T, dir string) *harness {
	h := newHarness(t, dir)
	if err := h.w.Load(); err != nil {
		t.Fatal(err)
	}
	h.run()
	return h
}

// newHarness builds the Watcher without loading or running it, for a test to
// adjust first.
func newHarness(t *testing.T, dir string) *harness {
	e, err := engine.New(nil, bucket.NewStore(0), engine.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, engine: e}
	h.w = &Watcher{Dir: dir, Debounce: 50 * time.Millisecond, Poll: 200 * time.Millisecond,
		Log: slog.New(slog.NewTextHandler(&h.logs, nil)),
		Apply: func(s *descriptors.Set) error {
			h.engine.Swap(s)
			h.mu.Lock()
			h.loads++
			h.mu.Unlock()
			return nil
		},
		Error: func(err error) {
			h.mu.Lock()
			h.fails++
			h.lastErr = err
			h.mu.Unlock()
		}}
	return h
}

// run starts Run; the test's cleanup stops it and checks it returned nil.
func (h *harness) run() {
	ctx, cancel := context.WithCancel(context.Background())
	h.done = make(chan error, 1)
	go func() { h.done <- h.w.Run(ctx) }()
	h.t.Cleanup(func() {
		cancel()
		if err := <-h.done; err != nil {
			h.t.Error(err)
		}
	})
}

// running fails the test if Run has returned.
func (h *harness) running() {
	h.t.Helper()
	select {
	case err := <-h.done:
		h.done <- err // for the cleanup
		h.t.Fatalf("Run returned early: %v", err)
	default:
	}
}

func (h *harness) counts() (int, int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.loads, h.fails
}

// waitFor polls cond, reporting the loads and failures if it never holds.
func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	testutil.Eventually(h.t, 30*time.Second, func() error {
		if cond() {
			return nil
		}
		h.mu.Lock()
		defer h.mu.Unlock()
		return fmt.Errorf("waiting for %s (loads %d, failures %d, last error %v)", what, h.loads, h.fails, h.lastErr)
	})
}

func (h *harness) limit(key string) uint32 {
	r := h.engine.Set().Match("d", []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: "v"}})
	if r == nil {
		return 0
	}
	return r.Limit().RequestsPerUnit()
}

// drawn returns how many of n draws on key=v pass now.
func (h *harness) drawn(key string, n int) int {
	ok := 0
	for i := 0; i < n; i++ {
		var dec engine.Decision
		err := h.engine.Decide(&dec, "d", []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: key, Value: "v"}}}}, 1, 0)
		if err != nil {
			h.t.Fatal(err)
		}
		if dec.Code == engine.OK {
			ok++
		}
	}
	return ok
}

func write(t *testing.T, path, s string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestInPlaceEditBreakAndRepair(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "rules.yaml")
	write(t, f, rules(5))
	h := start(t, dir)
	if h.drawn("stable", 3) != 2 {
		t.Fatal("stable rule should admit 2")
	}
	// An in-place edit changes k's limit.
	write(t, f, rules(7))
	h.waitFor("the edit", func() bool { return h.limit("k") == 7 })
	// Broken YAML: the old rules stay, and so does the stable rule's bucket state.
	write(t, f, rules(9)+"  - key: [broken\n")
	h.waitFor("the failure", func() bool { _, fails := h.counts(); return fails == 1 })
	if h.limit("k") != 7 {
		t.Fatal("a bad config replaced the rules in force")
	}
	if !strings.Contains(h.lastErr.Error(), "rules.yaml:") {
		t.Fatalf("error without position: %v", h.lastErr)
	}
	if h.drawn("stable", 1) != 0 {
		t.Fatal("bucket state lost on a failed reload")
	}
	// Repaired: the new rules apply, and the unchanged stable rule keeps its state.
	write(t, f, rules(9))
	h.waitFor("the repair", func() bool { return h.limit("k") == 9 })
	if h.drawn("stable", 1) != 0 {
		t.Fatal("an unchanged rule lost its bucket state on reload")
	}
}

func TestNewAndRemovedFiles(t *testing.T) {
	dir := t.TempDir()
	write(t, filepath.Join(dir, "a.yaml"), rules(1))
	h := start(t, dir)
	write(t, filepath.Join(dir, "b.yml"), "domain: other\ndescriptors: []\n")
	h.waitFor("the new file", func() bool { return h.engine.Set().Domain("other") != nil })
	os.Remove(filepath.Join(dir, "b.yml"))
	h.waitFor("the removal", func() bool { return h.engine.Set().Domain("other") == nil })
	// A dotfile (an editor's swap or lock file) is not config: the reload a
	// later file brings reads the directory with the dotfiles in it, and
	// succeeds.
	write(t, filepath.Join(dir, ".a.yaml.swp"), "garbage: [")
	write(t, filepath.Join(dir, ".#a.yaml"), "garbage: [")
	write(t, filepath.Join(dir, "c.yaml"), "domain: third\ndescriptors: []\n")
	h.waitFor("the file after the dotfile", func() bool { return h.engine.Set().Domain("third") != nil })
	if _, fails := h.counts(); fails != 0 {
		t.Fatal("a dotfile was loaded")
	}
}

// TestConfigMapSymlinkSwap reproduces what the kubelet does on a ConfigMap
// change: files are symlinks through ..data, which is atomically re-pointed.
func TestConfigMapSymlinkSwap(t *testing.T) {
	dir := t.TempDir()
	mk := func(name string, rpu int) {
		os.Mkdir(filepath.Join(dir, name), 0o755)
		write(t, filepath.Join(dir, name, "rules.yaml"), rules(rpu))
	}
	mk("..2026_12_02_00_00_00.1", 3)
	if err := os.Symlink("..2026_12_02_00_00_00.1", filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("..data/rules.yaml", filepath.Join(dir, "rules.yaml")); err != nil {
		t.Fatal(err)
	}
	h := start(t, dir)
	if h.limit("k") != 3 {
		t.Fatalf("initial limit %d", h.limit("k"))
	}
	mk("..2026_12_02_00_01_00.2", 11)
	os.Symlink("..2026_12_02_00_01_00.2", filepath.Join(dir, "..data_tmp"))
	if err := os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Join(dir, "..2026_12_02_00_00_00.1"))
	h.waitFor("the swap", func() bool { return h.limit("k") == 11 })
}

func TestDirectoryDeletedAndUnreadable(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "conf")
	os.Mkdir(dir, 0o755)
	write(t, filepath.Join(dir, "r.yaml"), rules(4))
	h := start(t, dir)
	os.RemoveAll(dir)
	h.waitFor("the failure", func() bool { _, f := h.counts(); return f >= 1 })
	if h.limit("k") != 4 {
		t.Fatal("rules lost when the directory disappeared")
	}
	// A half-written file: the old rules stay.
	os.Mkdir(dir, 0o755)
	write(t, filepath.Join(dir, "r.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: hour, requ")
	h.waitFor("a second failure", func() bool { _, f := h.counts(); return f >= 2 })
	if h.limit("k") != 4 {
		t.Fatal("rules replaced by a half-written file")
	}
	write(t, filepath.Join(dir, "r.yaml"), rules(6))
	h.waitFor("recovery", func() bool { return h.limit("k") == 6 })
}

// TestNoFsnotifyFallsBackToPolling is a node out of inotify instances
// (fs.inotify.max_user_instances): fsnotify cannot start, and the daemon must
// keep running and see changes by polling, not exit. When instances free up,
// it watches again.
func TestNoFsnotifyFallsBackToPolling(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "rules.yaml")
	write(t, f, rules(5))
	h := newHarness(t, dir)
	h.w.Poll = 20 * time.Millisecond
	var short atomic.Bool
	short.Store(true)
	h.w.newWatcher = func() (*fsnotify.Watcher, error) {
		if short.Load() {
			return nil, syscall.EMFILE
		}
		return fsnotify.NewWatcher()
	}
	if err := h.w.Load(); err != nil {
		t.Fatal(err)
	}
	h.run()
	write(t, f, rules(7))
	h.waitFor("the edit, by polling", func() bool { return h.limit("k") == 7 })
	h.running()
	if !h.w.Polling() {
		t.Fatal("Polling() is false without fsnotify")
	}
	// Every poll retries fsnotify; only the first failure is worth a warning.
	if n := strings.Count(h.logs.String(), "polling only"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, h.logs.String())
	}
	short.Store(false)
	h.waitFor("fsnotify to be back", func() bool { return !h.w.Polling() })
	write(t, f, rules(8))
	h.waitFor("the next edit", func() bool { return h.limit("k") == 8 })
}

// TestUnwatchableDirPolls is a config dir that does not exist yet when Run
// starts: fw.Add fails, Run warns and polls, and picks the directory up once it
// appears.
func TestUnwatchableDirPolls(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "not-yet")
	h := newHarness(t, dir)
	h.w.Poll = 20 * time.Millisecond
	if err := h.w.Load(); err == nil {
		t.Fatal("loading a missing directory succeeded")
	}
	h.run()
	h.waitFor("the warning", func() bool { return strings.Contains(h.logs.String(), "polling only") })
	if !h.w.Polling() {
		t.Fatal("Polling() is false while Dir cannot be watched")
	}
	os.Mkdir(dir, 0o755)
	write(t, filepath.Join(dir, "rules.yaml"), rules(3))
	h.waitFor("the new directory, by polling", func() bool { return h.limit("k") == 3 })
	h.waitFor("the directory to be watched", func() bool { return !h.w.Polling() })
	h.running()
}

// TestPollZeroWithoutFsnotify: Poll 0 means "fsnotify is enough", which it is
// not when it cannot start; Run still polls, at DefaultPoll.
func TestPollZeroWithoutFsnotify(t *testing.T) {
	h := newHarness(t, t.TempDir())
	h.w.Poll = 0
	h.w.newWatcher = func() (*fsnotify.Watcher, error) { return nil, syscall.EMFILE }
	h.run()
	h.waitFor("the warning", func() bool { return strings.Contains(h.logs.String(), "poll="+DefaultPoll.String()) })
	h.running()
}

// TestApplyMayRefuse: a set the apply function refuses is reported like one
// that failed to load, and Load returns the refusal.
func TestApplyMayRefuse(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	refused := errors.New("refused by apply")
	var reported error
	w := &Watcher{Dir: dir, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Apply: func(*descriptors.Set) error { return refused },
		Error: func(err error) { reported = err }}
	if err := w.Load(); !errors.Is(err, refused) || !errors.Is(reported, refused) {
		t.Fatalf("Load returned %v, Error saw %v; want the refusal in both", err, reported)
	}
}
