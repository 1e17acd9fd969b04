package main

import (
	"context"
	"os"
	"os/signal"
)

// signalAfter returns a channel closed when one of sigs arrives after ctx has
// ended. main's signal.NotifyContext turns the first SIGTERM or SIGINT into the
// end of ctx; this hears the next one. It starts listening only once ctx has
// ended, and os/signal delivers a signal to every listener under the lock
// Notify takes, so the signal that ended ctx is never counted again. release
// stops listening and waits for the goroutine to end; call it before returning.
func signalAfter(ctx context.Context, sigs ...os.Signal) (fired <-chan struct{}, release func()) {
	ch := make(chan struct{})
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		select {
		case <-ctx.Done():
		case <-quit:
			return
		}
		c := make(chan os.Signal, 1)
		signal.Notify(c, sigs...)
		defer signal.Stop(c)
		select {
		case <-c:
			close(ch)
		case <-quit:
		}
	}()
	return ch, func() {
		close(quit)
		<-done
	}
}
