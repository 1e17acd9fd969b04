package daemon

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// A checkpoint stuck on the disk (the keeper's write lock held, as a
// WriteFile blocked in write or fsync holds it) does not hold the daemon's
// stop past --shutdown-timeout.
func TestStuckCheckpointDoesNotHoldTheStop(t *testing.T) {
	cfg := testConfig(t)
	cfg.StateFile = filepath.Join(t.TempDir(), "state")
	cfg.StateInterval = 20 * time.Millisecond
	cfg.ShutdownTimeout = 200 * time.Millisecond
	d, err := New(cfg, quietLog(), "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, nil) }()
	time.Sleep(100 * time.Millisecond)
	d.state.mu.Lock()                  // the disk hangs
	time.Sleep(100 * time.Millisecond) // a checkpoint tick now waits inside write
	stopped := time.Now()
	cancel()
	// The abandoned writes go on once the disk answers; they must be over
	// before the test's directory is removed.
	defer d.state.writing.Wait()
	select {
	case <-done:
		d.state.mu.Unlock()
	case <-time.After(cfg.ShutdownTimeout + 2*time.Second):
		d.state.mu.Unlock()
		<-done
		t.Fatalf("Run returned %v after the stop, with --shutdown-timeout %v: it waited for the stuck checkpoint", time.Since(stopped).Round(time.Millisecond), cfg.ShutdownTimeout)
	}
}
