package h2

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
)

// A relayed call goes to the in-process grpc-go server as a bidirectional
// stream of raw messages: whatever the method's shape, the client's messages
// go in as they arrive and the server's come back as it sends them, and the
// status ends the call here as it ended there.

// inbox holds a relayed call's messages until its sender takes them. What it
// holds is bounded by the connection window: the bytes go back to the client
// only as the sender takes them.
type inbox struct {
	mu    sync.Mutex
	msgs  [][]byte
	ended bool // the client sent its last message
	gone  bool // the call is over
	wake  chan struct{}
}

func newInbox() *inbox { return &inbox{wake: make(chan struct{}, 1)} }

func (b *inbox) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

func (b *inbox) push(m []byte) {
	b.mu.Lock()
	b.msgs = append(b.msgs, m)
	b.mu.Unlock()
	b.signal()
}

func (b *inbox) end() {
	b.mu.Lock()
	b.ended = true
	b.mu.Unlock()
	b.signal()
}

func (b *inbox) close() {
	b.mu.Lock()
	b.gone = true
	b.mu.Unlock()
	b.signal()
}

// next returns the next message; with ok false, there is none to come, and
// ended says whether the client ended its side (rather than the call ending).
func (b *inbox) next(ctx context.Context) (m []byte, ok, ended bool) {
	for {
		b.mu.Lock()
		switch {
		case b.gone:
			b.mu.Unlock()
			return nil, false, false
		case len(b.msgs) > 0:
			m = b.msgs[0]
			b.msgs[0] = nil
			b.msgs = b.msgs[1:]
			b.mu.Unlock()
			return m, true, false
		case b.ended:
			b.mu.Unlock()
			return nil, false, true
		}
		b.mu.Unlock()
		select {
		case <-b.wake:
		case <-ctx.Done():
			return nil, false, false
		}
	}
}

// startRelay opens a relayed call. Called with wmu held.
func (c *conn) startRelay(st *stream, path string) {
	st.relay = newInbox()
	var ctx context.Context
	var cancel context.CancelFunc
	if st.timed {
		ctx, cancel = context.WithDeadline(c.ctx, st.deadline)
	} else {
		ctx, cancel = context.WithCancel(c.ctx)
	}
	st.cancel = cancel
	if st.recvDone {
		st.relay.end()
	}
	c.goroutines.Add(2)
	cs := make(chan grpc.ClientStream, 1)
	inDone := make(chan struct{})
	go func() {
		defer close(inDone)
		c.relayIn(ctx, st, cs)
	}()
	go func() {
		c.relayOut(ctx, st, path, cs)
		<-inDone
		// Only now does the call stop counting against the connection's
		// streams: a client that resets relayed calls as fast as it opens
		// them holds no more than MaxConcurrentStreams of them running.
		c.wmu.Lock()
		c.open--
		c.freed.Broadcast()
		c.wmu.Unlock()
		c.goroutines.Done()
	}()
}

// relayData splits a relayed call's bytes into messages for its sender.
// Called with wmu held.
func (c *conn) relayData(st *stream, data []byte) {
	st.msg = append(st.msg, data...)
	for len(st.msg) >= 5 {
		if st.msg[0] != 0 {
			c.finish(st, codes.Internal, "grpc: compressed flag set with identity or empty encoding")
			return
		}
		l := binary.BigEndian.Uint32(st.msg[1:5])
		if l > maxRecvMsg {
			c.finish(st, codes.ResourceExhausted, fmt.Sprintf("grpc: received message larger than max (%d vs. %d)", l, maxRecvMsg))
			return
		}
		if len(st.msg) < 5+int(l) {
			break
		}
		st.relay.push(append([]byte(nil), st.msg[5:5+l]...))
		st.msg = st.msg[5+l:]
	}
	if len(st.msg) == 0 {
		st.msg = nil
	}
	if st.recvDone {
		if st.msg != nil {
			c.finish(st, codes.Internal, "the request ended inside a gRPC message")
			return
		}
		st.relay.end()
	}
}

// relayIn sends the client's messages to grpc-go as the call's sender takes
// them, and gives their bytes back to the client's windows.
func (c *conn) relayIn(ctx context.Context, st *stream, streams <-chan grpc.ClientStream) {
	defer c.goroutines.Done()
	var cs grpc.ClientStream
	select {
	case cs = <-streams:
	case <-ctx.Done():
		return
	}
	if cs == nil {
		return
	}
	for {
		m, ok, ended := st.relay.next(ctx)
		if !ok {
			if ended {
				cs.CloseSend()
			}
			return
		}
		if err := cs.SendMsg(m); err != nil {
			return // the call failed: relayOut sees why
		}
		c.relayUsed(st, int64(len(m)+5))
	}
}

// relayUsed gives n bytes of a relayed call back to the client's stream
// window (the connection window had them back as they arrived).
func (c *conn) relayUsed(st *stream, n int64) {
	c.wmu.Lock()
	if st.done || c.closed {
		c.wmu.Unlock()
		return
	}
	// Every message goes back at once. Held for a batch, the credit could
	// leave the client less window than its next message needs, and the
	// server, which relays only whole messages, would wait for it forever.
	if !st.recvDone {
		c.out = appendWindowUpdate(c.out, st.id, uint32(n))
		st.recvWin += n
	}
	c.wmu.Unlock()
	c.flush()
}

// relayOut opens the call on grpc-go and sends its answers and status back.
func (c *conn) relayOut(ctx context.Context, st *stream, path string, streams chan<- grpc.ClientStream) {
	cs, err := c.s.innerCC.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, path, grpc.ForceCodecV2(rawCodec{}))
	streams <- cs
	for err == nil {
		var m []byte
		if err = cs.RecvMsg(&m); err == nil && !c.relaySend(st, m) {
			return
		}
	}
	if errors.Is(err, io.EOF) {
		err = nil
	}
	s := status.Convert(err)
	c.wmu.Lock()
	if !st.done && !c.closed {
		c.finish(st, s.Code(), s.Message())
	}
	c.wmu.Unlock()
	c.flush()
}

// relaySend queues one answer of a relayed call, waiting while too much of it
// waits for the client's window. It reports whether the call goes on.
func (c *conn) relaySend(st *stream, m []byte) bool {
	c.wmu.Lock()
	for !st.done && !c.closed && len(st.pend) > relayPending {
		c.windowed.Wait()
	}
	if st.done || c.closed {
		c.wmu.Unlock()
		return false
	}
	c.head(st)
	st.pend = binary.BigEndian.AppendUint32(append(st.pend, 0), uint32(len(m)))
	st.pend = append(st.pend, m...)
	c.pump(st)
	c.wmu.Unlock()
	return c.flush() == nil
}

// rawCodec passes messages through as bytes.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, ok := v.([]byte)
	if !ok {
		return nil, fmt.Errorf("h2: relay marshals bytes, not %T", v)
	}
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	p, ok := v.(*[]byte)
	if !ok {
		return fmt.Errorf("h2: relay unmarshals into *[]byte, not %T", v)
	}
	*p = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }
