package daemon

import (
	"bytes"
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// opLogBuf is a log sink safe for the daemon's goroutines.
type opLogBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *opLogBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *opLogBuf) String() string { s.mu.Lock(); defer s.mu.Unlock(); return s.b.String() }

// TestUnixSocketIsNotWarnedAsRemote: a gRPC listener on a unix socket, the
// sidecar's safest setting and upstream's GRPC_UDS, is reached through the
// filesystem; it gets no WARN about listening beyond loopback.
func TestUnixSocketIsNotWarnedAsRemote(t *testing.T) {
	cfg := testConfig(t)
	cfg.GRPCAddr = "unix:" + filepath.Join(t.TempDir(), "rls.sock")
	var logs opLogBuf
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, nil)), "test")
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, d)
	if strings.Contains(logs.String(), "non-loopback") {
		t.Errorf("a unix socket is warned as non-loopback:\n%s", logs.String())
	}
}

// TestStateWriteErrorLoggedOncePerCause: a state directory that takes no
// file (a read-only root filesystem, another user's directory) is a WARN at
// start, then one ERROR, not one every --state-interval; a new cause is
// logged again, and so is the recovery.
func TestStateWriteErrorLoggedOncePerCause(t *testing.T) {
	cfg := testConfig(t)
	dir := t.TempDir()
	cfg.StateFile = filepath.Join(dir, "missing", "state") // its directory does not exist
	var logs opLogBuf
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})), "test")
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, d)
	if !strings.Contains(logs.String(), "level=WARN msg=\"state file cannot be written") {
		t.Errorf("no WARN at start for a state directory that takes no file:\n%s", logs.String())
	}
	for range 20 {
		if _, err := d.state.write("checkpoint"); err == nil {
			t.Fatal("a write into a missing directory succeeded")
		}
	}
	if n := strings.Count(logs.String(), "level=ERROR"); n != 1 {
		t.Errorf("%d ERROR records for 20 failed writes of one cause, want 1:\n%s", n, logs.String())
	}
	cfg.StateFile = filepath.Join(dir, "state")
	d.state.path = cfg.StateFile
	if _, err := d.state.write("checkpoint"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "state file written again") {
		t.Errorf("the recovery is not logged:\n%s", logs.String())
	}
}

// runUntilCleanup runs d until the test ends: a daemon New returned must be
// Run.
func runUntilCleanup(t *testing.T, d *Daemon) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}
