package state

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A state file that is a FIFO is refused like a directory or a device; it
// never holds up the daemon's start waiting for a writer.
func TestReadFileFIFO(t *testing.T) {
	p := filepath.Join(t.TempDir(), "state")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Skip(err)
	}
	done := make(chan error, 1)
	go func() { _, err := ReadFile(p, MaxSize(1000)); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("a FIFO was read as a snapshot")
		}
	case <-time.After(2 * time.Second):
		t.Fatal("ReadFile on a FIFO still blocked after 2s: the daemon's start hangs in keeper.load")
	}
}
