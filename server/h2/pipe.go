package h2

import (
	"context"
	"net"
	"sync"
)

// pipeListener is an in-memory net.Listener: each dial hands one end of a
// net.Pipe to Accept and returns the other. The relayed calls reach the
// in-process grpc-go server over it, with no socket and no file descriptor.
// net.Pipe is unbuffered, which suits grpc-go: each side of its transport
// reads without waiting on its handlers, so a write always finds a reader.
// Safe for concurrent use; the zero value is not ready: use newPipeListener.
type pipeListener struct {
	conns     chan net.Conn
	done      chan struct{} // closed by Close
	closeOnce sync.Once
}

var _ net.Listener = (*pipeListener)(nil)

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// Accept waits for a dial, or for Close.
func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close makes Accept, and any dial waiting for it, return net.ErrClosed.
// Connections already accepted go on.
func (l *pipeListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

// dial connects to the listener, once Accept takes the other end.
func (l *pipeListener) dial(ctx context.Context) (net.Conn, error) {
	server, client := net.Pipe()
	select {
	case l.conns <- server:
		return client, nil
	case <-l.done:
		server.Close()
		client.Close()
		return nil, &net.OpError{Op: "dial", Net: "pipe", Err: net.ErrClosed}
	case <-ctx.Done():
		server.Close()
		client.Close()
		return nil, ctx.Err()
	}
}

// pipeAddr is a pipeListener's address: there is only the one.
type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "sharelimit-inner" }
