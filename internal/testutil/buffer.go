package testutil

import (
	"bytes"
	"sync"
)

// Buffer collects what a goroutine or a child process writes, for the test
// goroutine to read while the writer still runs. Safe for concurrent use; the
// zero value is empty and ready.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
