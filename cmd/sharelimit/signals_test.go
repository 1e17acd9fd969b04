package main

import (
	"context"
	"errors"
	"os/signal"
	"syscall"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// TestSignalAfterHearsTheSecondSignal sets ctx up as main does: the first
// signal ends it. That one must not count again; the next one fires.
func TestSignalAfterHearsTheSecondSignal(t *testing.T) {
	sig := syscall.SIGUSR1 // not SIGINT: nothing else in a test run listens for it
	// This registration also keeps the signal from killing the test binary.
	ctx, stop := signal.NotifyContext(context.Background(), sig)
	defer stop()
	fired, release := signalAfter(ctx, sig)
	defer release()

	syscall.Kill(syscall.Getpid(), sig)
	testutil.Within(t, ctx.Done(), "the first signal to end ctx")
	select {
	case <-fired:
		t.Fatal("the signal that ended ctx was counted again")
	case <-time.After(100 * time.Millisecond):
	}
	// signalAfter starts listening as ctx ends, a moment the test cannot see:
	// signal until it hears.
	testutil.Eventually(t, 30*time.Second, func() error {
		syscall.Kill(syscall.Getpid(), sig)
		select {
		case <-fired:
			return nil
		case <-time.After(20 * time.Millisecond):
			return errors.New("a second signal was not heard")
		}
	})
}

func TestSignalAfterReleaseWithoutSignal(t *testing.T) {
	fired, release := signalAfter(context.Background(), syscall.SIGUSR1)
	release() // must return: its goroutine ends (goleak checks at exit)
	select {
	case <-fired:
		t.Fatal("fired without a signal")
	default:
	}
}
