package testutil

import (
	"errors"
	"fmt"
	"testing"
	"time"
)

// Within waits for ch, failing the test after a deadline far longer than any
// healthy run needs: it catches hangs, it does not measure speed.
func Within[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(20 * time.Second):
		t.Fatalf("timed out waiting for %s", what)
		panic("unreachable")
	}
}

// Eventually calls cond until it returns nil, and fails t with cond's last
// error when timeout passes first. cond says in its error what it is waiting
// for and what it saw instead. The timeout catches hangs, it does not measure
// speed: make it many times what a healthy run needs.
func Eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	if err := Poll(timeout, cond); err != nil {
		t.Fatal(err)
	}
}

// Poll is Eventually for callers that cannot fail a test (a helper that
// returns an error, or a goroutine other than the test's): it returns nil
// once cond does, or cond's last error once timeout has passed.
func Poll(timeout time.Duration, cond func() error) error {
	deadline := time.Now().Add(timeout)
	pause := time.Millisecond
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return errors.Join(errors.New("timed out after "+timeout.String()), err)
		}
		time.Sleep(pause)
		// Quick to see a condition that holds soon; no busier than 20 polls
		// a second for one that takes its time.
		pause = min(2*pause, 50*time.Millisecond)
	}
}

// Cond adapts a condition that says only whether it holds, for Eventually
// and Poll: while it does not hold, the error is the description of what is
// awaited, made from format and args.
func Cond(cond func() bool, format string, args ...any) func() error {
	return func() error {
		if !cond() {
			return fmt.Errorf("waiting for "+format, args...)
		}
		return nil
	}
}
