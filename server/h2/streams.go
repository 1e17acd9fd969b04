package h2

// A stream's life on the reading side after its HEADERS (headers.go): DATA
// fills its request, and a complete ShouldRateLimit request is decided and
// answered; requests that are not gRPC get an HTTP status.

import (
	"encoding/binary"
	"fmt"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/sharelimit/sharelimit/server/wire"
)

// slotWait bounds how long a new stream waits for a slot that relayed calls
// still ending hold.
const slotWait = 5 * time.Second

// waitSlot waits, for at most slotWait, while the stream limit is reached only
// because relayed calls the client has seen end still count (their
// goroutines are ending: the defence against rapid reset). The client kept
// to the limit, so its stream waits rather than being refused, as grpc-go's
// handler quota does; the connection's reading waits with it. What is already
// written goes out first. Called with wmu held, which it releases while it
// waits.
func (c *conn) waitSlot() {
	c.wmu.Unlock()
	c.flush()
	c.wmu.Lock()
	expired := false
	t := time.AfterFunc(slotWait, func() {
		c.wmu.Lock()
		expired = true
		c.freed.Broadcast()
		c.wmu.Unlock()
	})
	defer t.Stop()
	for c.open >= MaxConcurrentStreams && len(c.streams) < MaxConcurrentStreams && !c.closed && !expired {
		c.freed.Wait()
	}
}

const errNoMessage = "cardinality violation: received no request message from non-client-streaming RPC"

// data takes a DATA frame: flow control first, then the stream's message.
func (c *conn) data(f *http2.DataFrame) error {
	n := int64(f.Header().Length)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.recvWin -= n; c.recvWin < 0 {
		return http2.ConnectionError(http2.ErrCodeFlowControl)
	}
	// The connection window is given back as DATA arrives, whatever
	// becomes of it: only a stream's own window bounds what one request
	// may have buffered. Were it given back only as requests complete, a
	// client interleaving many large requests would run it to zero with
	// every one of them part-sent, and nothing would ever complete.
	c.used(n)
	st := c.streams[f.StreamID]
	if st == nil || st.recvDone {
		if f.StreamID > c.lastStream {
			return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
		}
		if st != nil {
			c.drop(st)
		} else if _, mayFrame := c.closedState(f.StreamID); mayFrame {
			return nil // sent before the client saw this server's reset
		}
		c.out = appendRSTStream(c.out, f.StreamID, http2.ErrCodeStreamClosed)
		return nil
	}
	if st.recvWin -= n; st.recvWin < 0 {
		c.drop(st)
		c.out = appendRSTStream(c.out, st.id, http2.ErrCodeFlowControl)
		return nil
	}
	data := f.Data()
	if pad := n - int64(len(data)); pad > 0 {
		// Padding goes back to the stream window as it arrives, so
		// that a padded request never runs out of stream window.
		if !f.StreamEnded() {
			c.out = appendWindowUpdate(c.out, st.id, uint32(pad))
			st.recvWin += pad
		}
	}
	st.got += int64(len(data))
	if f.StreamEnded() {
		st.recvDone = true
	}
	if st.length >= 0 && (st.got > st.length || (st.recvDone && st.got != st.length)) {
		c.drop(st)
		c.out = appendRSTStream(c.out, st.id, http2.ErrCodeProtocol)
		return nil
	}
	if st.notGRPC != "" {
		// Discarded as it arrives, so its window goes back at once: the
		// refusal waits for the end of the request, which a body larger
		// than the window would otherwise never reach.
		if n := int64(len(data)); n > 0 && !st.recvDone {
			c.out = appendWindowUpdate(c.out, st.id, uint32(n))
			st.recvWin += n
		}
		if st.recvDone {
			c.refuse(st)
		}
		return nil
	}
	if st.relay != nil {
		c.relayData(st, data)
		return nil
	}
	c.request(st, data)
	return nil
}

// request gathers a ShouldRateLimit request and answers it once complete.
func (c *conn) request(st *stream, data []byte) {
	msg := data
	if st.msg != nil || !st.recvDone {
		// Rare: the request spans frames, so it is copied.
		st.msg = append(st.msg, data...)
		msg = st.msg
	}
	if len(msg) >= 5 {
		if msg[0] != 0 {
			// grpc-encoding, if any, was identity: checked with the headers.
			c.finish(st, codes.Internal, "grpc: compressed flag set with identity or empty encoding")
			return
		}
		l := binary.BigEndian.Uint32(msg[1:5])
		if l > maxRecvMsg {
			c.finish(st, codes.ResourceExhausted, fmt.Sprintf("grpc: received message larger than max (%d vs. %d)", l, maxRecvMsg))
			return
		}
		if len(msg) > 5+int(l) {
			// A second message: refused as it begins, not at the end of
			// the request, which the stream's window may never let come.
			c.finish(st, codes.Internal, "cardinality violation: received multiple request messages for non-client-streaming RPC")
			return
		}
	}
	if !st.recvDone {
		return
	}
	// Unary: exactly one message. The errors read as grpc-go's.
	switch {
	case len(msg) == 0:
		c.finish(st, codes.Internal, errNoMessage)
		return
	case len(msg) < 5 || len(msg) < 5+int(binary.BigEndian.Uint32(msg[1:5])):
		c.finish(st, codes.Internal, "unexpected EOF")
		return
	case len(msg) > 5+int(binary.BigEndian.Uint32(msg[1:5])):
		c.finish(st, codes.Internal, "cardinality violation: received multiple request messages for non-client-streaming RPC")
		return
	}
	req := new(rlsv3.RateLimitRequest)
	if err := wire.DecodeRequest(msg[5:], req); err != nil {
		c.finish(st, codes.Internal, "grpc: error unmarshalling request: "+err.Error())
		return
	}
	st.msg = nil
	if st.timer != nil {
		st.timer.Stop() // the deadline's, armed while the request arrived
		st.timer = nil
	}
	if st.timed && !time.Now().Before(st.deadline) {
		// The client has given up on it: a token spent now would be a
		// request refused later for nothing.
		c.finish(st, codes.DeadlineExceeded, errDeadline)
		return
	}
	// The decision runs with wmu held: it does not block, and holding the
	// lock keeps the answer's frames next to its decision.
	resp, wait, err := c.s.rls.Answer(req)
	switch {
	case err != nil:
		s := status.Convert(err)
		c.finish(st, s.Code(), s.Message())
	case wait > 0:
		c.answerLater(st, resp, wait)
	default:
		c.answer(st, resp)
	}
}

// refusal is the body of an answer to a request that is not gRPC.
const refusal = "sharelimit serves gRPC here: POST with content-type application/grpc\n"

// refuse answers a request that is not gRPC with its HTTP status.
func (c *conn) refuse(st *stream) {
	st.sentHead = true
	if st.head {
		// A response to HEAD has no content (RFC 9110, 9.3.2).
		c.headerFrame(st.id, appendNeverIndexed(nil, ":status", st.notGRPC), true)
		c.forget(st)
		return
	}
	c.headerFrame(st.id, appendNeverIndexed(appendNeverIndexed(nil, ":status", st.notGRPC), "content-type", "text/plain; charset=utf-8"), false)
	st.pend = append(st.pend, refusal...)
	st.endData = true
	c.pump(st)
}

// endRecv ends the client's side of a stream, as trailers from it do.
func (c *conn) endRecv(st *stream) {
	st.recvDone = true
	if st.notGRPC != "" {
		c.refuse(st)
		return
	}
	if st.relay != nil {
		c.relayData(st, nil)
		return
	}
	c.request(st, nil)
}
