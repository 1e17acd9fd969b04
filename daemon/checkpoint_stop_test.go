package daemon

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// A checkpoint stuck on the disk (the keeper's write lock held, as a
// WriteFile blocked in write or fsync holds it) does not hold the daemon's
// stop past --shutdown-timeout.
func TestStuckCheckpointDoesNotHoldTheStop(t *testing.T) {
	cfg := testConfig(t)
	cfg.StateFile = filepath.Join(t.TempDir(), "state")
	cfg.StateInterval = 20 * time.Millisecond
	cfg.ShutdownTimeout = 200 * time.Millisecond
	var logs testutil.Buffer
	d, err := New(cfg, slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn})), "test")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx, nil) }()
	// The daemon runs once it has written a checkpoint.
	testutil.Eventually(t, 30*time.Second, func() error {
		var m dto.Metric
		if err := d.state.writes.Write(&m); err != nil || m.GetCounter().GetValue() < 1 {
			return errors.New("no checkpoint written")
		}
		return nil
	})
	d.state.mu.Lock() // the disk hangs
	// A checkpoint is stuck once a later tick finds it still being written.
	testutil.Eventually(t, 30*time.Second, func() error {
		if !strings.Contains(logs.String(), "state checkpoint skipped") {
			return errors.New("no checkpoint stuck on the disk")
		}
		return nil
	})
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
