package daemon

import (
	"context"
	"log/slog"
	"net/http"
	"time"
)

// grpcStopper is what shutdown needs of *grpc.Server.
type grpcStopper interface {
	GracefulStop()
	Stop()
}

// shutdown is the daemon's stop, once health reports NOT_SERVING: the drain,
// then the gRPC and admin servers.
type shutdown struct {
	Drain   time.Duration // how long to keep serving while Envoy moves away
	Timeout time.Duration // how long in-flight calls get once the stop begins
	// Now is closed when the operator wants the daemon gone at once (a second
	// SIGTERM or SIGINT): what is left of the drain and of the graceful stop is
	// skipped. nil never closes.
	Now <-chan struct{}
	Log *slog.Logger
}

// run drains, then stops gs and each of hs. closeStreams ends the gRPC
// streams that would otherwise hold a graceful stop open. It reports whether
// the gRPC stop had to be forced.
func (s shutdown) run(gs grpcStopper, closeStreams func(), hs ...*http.Server) (forced bool) {
	if s.drain() {
		s.Log.Warn("signalled again: cutting the drain short and stopping now")
	}
	forced = s.stopGRPC(gs, closeStreams)
	for _, h := range hs {
		s.stopHTTP(h)
	}
	return forced
}

// drain waits out Drain, unless Now closes first. It reports whether it was
// cut short.
func (s shutdown) drain() (cut bool) {
	t := time.NewTimer(s.Drain)
	defer t.Stop()
	select {
	case <-t.C:
		return false
	case <-s.Now:
		return true
	}
}

// stopGRPC ends the long-lived streams first, because GracefulStop waits for
// every RPC and those never end on their own; then in-flight calls get Timeout
// to finish. It forces Stop after Timeout, or at once when Now is closed, and
// reports whether it did. It returns only once gs has stopped.
func (s shutdown) stopGRPC(gs grpcStopper, closeStreams func()) (forced bool) {
	closeStreams()
	select {
	case <-s.Now:
		gs.Stop()
		return true
	default:
	}
	stopped := make(chan struct{})
	go func() {
		gs.GracefulStop()
		close(stopped)
	}()
	t := time.NewTimer(s.Timeout)
	defer t.Stop()
	select {
	case <-stopped:
		return false
	case <-t.C:
		s.Log.Warn("in-flight requests did not finish in time; stopping", "timeout", s.Timeout)
	case <-s.Now:
		s.Log.Warn("signalled again: stopping without waiting for in-flight requests")
	}
	gs.Stop()
	<-stopped // Stop ends GracefulStop too: no goroutine outlives the stop
	return true
}

// stopHTTP stops the admin server like the gRPC one: in-flight requests get
// Timeout, unless Now closes; then the connections left are closed.
func (s shutdown) stopHTTP(hs *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), s.Timeout)
	cut := make(chan struct{})
	go func() {
		defer close(cut)
		select {
		case <-s.Now:
			cancel()
		case <-ctx.Done():
		}
	}()
	defer func() {
		cancel()
		<-cut
	}()
	if err := hs.Shutdown(ctx); err != nil {
		hs.Close()
	}
}
