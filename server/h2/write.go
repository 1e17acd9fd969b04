package h2

// The writing side of a stream: answers, statuses and trailers, within the
// peer's flow-control windows; and a stream's end.

import (
	"encoding/binary"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/server/wire"
)

// answer writes an answer's headers, message and trailers.
func (c *conn) answer(st *stream, resp *rlsv3.RateLimitResponse) {
	c.head(st)
	start := len(c.out)
	c.out = appendFrameHeader(c.out, 0, http2.FrameData, 0, st.id)
	c.out = append(c.out, 0, 0, 0, 0, 0)
	if wire.Writable(resp) {
		c.out = wire.AppendResponse(c.out, resp)
	} else {
		var err error
		if c.out, err = (proto.MarshalOptions{}).MarshalAppend(c.out, resp); err != nil {
			c.out = c.out[:start]
			c.finish(st, codes.Internal, "grpc: error while marshaling: "+err.Error())
			return
		}
	}
	payload := c.out[start+frameHeaderLen:]
	binary.BigEndian.PutUint32(payload[1:5], uint32(len(payload)-5))
	if n := int64(len(payload)); len(st.pend) == 0 && n <= c.sendWin && n <= st.sendWin && len(payload) <= c.peerFrame {
		putFrameLength(c.out[start:], len(payload))
		c.sendWin -= n
		st.sendWin -= n
		c.trail(st, trailersOK)
		return
	}
	// Not enough window, or a frame too large for the peer: the message
	// waits in the stream and goes out as the window opens.
	st.pend = append(st.pend, payload...)
	c.out = c.out[:start]
	c.trailersAfter(st, trailersOK)
}

// head writes the response headers once.
func (c *conn) head(st *stream) {
	if st.sentHead {
		return
	}
	st.sentHead = true
	c.headerFrame(st.id, responseHeaders, false)
}

// headerFrame writes a HEADERS frame holding block, ending the stream when
// end is set.
func (c *conn) headerFrame(id uint32, block []byte, end bool) {
	c.sent()
	flags := http2.FlagHeadersEndHeaders
	if end {
		flags |= http2.FlagHeadersEndStream
	}
	if c.sizeUpdate {
		block = append([]byte{hpackTableSizeZero}, block...)
		c.sizeUpdate = false
	}
	if len(block) <= c.peerFrame {
		c.out = appendFrameHeader(c.out, len(block), http2.FrameHeaders, flags, id)
		c.out = append(c.out, block...)
		return
	}
	// A block larger than the peer's frames (a long status message) goes
	// on in CONTINUATION frames.
	c.out = appendFrameHeader(c.out, c.peerFrame, http2.FrameHeaders, flags&^http2.FlagHeadersEndHeaders, id)
	c.out = append(c.out, block[:c.peerFrame]...)
	for block = block[c.peerFrame:]; len(block) > 0; {
		n := min(len(block), c.peerFrame)
		var fl http2.Flags
		if n == len(block) {
			fl = http2.FlagContinuationEndHeaders
		}
		c.out = appendFrameHeader(c.out, n, http2.FrameContinuation, fl, id)
		c.out = append(c.out, block[:n]...)
		block = block[n:]
	}
}

// finish ends a call with a status: in the trailers after what was sent,
// or, when nothing was, as a trailers-only answer.
func (c *conn) finish(st *stream, code codes.Code, msg string) {
	if st.done {
		return
	}
	if !st.sentHead && len(st.pend) == 0 {
		st.sentHead = true
		c.reply(st, appendStatusFields(append([]byte(nil), responseHeaders...), code, msg))
		return
	}
	c.trailersAfter(st, appendStatusFields(nil, code, msg))
}

// reply answers with one header block that ends the stream.
func (c *conn) reply(st *stream, block []byte) {
	st.sentHead = true
	c.headerFrame(st.id, block, true)
	c.forget(st)
}

// trailersAfter sends the trailers once the data before them is out.
func (c *conn) trailersAfter(st *stream, block []byte) {
	if len(st.pend) == 0 {
		c.trail(st, block)
		return
	}
	st.trailers = block
	c.pump(st)
}

// trail writes the trailers and forgets the stream.
func (c *conn) trail(st *stream, block []byte) {
	c.headerFrame(st.id, block, true)
	c.forget(st)
}

// forget ends a stream whose answer is complete. A client still sending is
// told to stop (RST_STREAM NO_ERROR, as gRPC does).
func (c *conn) forget(st *stream) {
	if !st.recvDone {
		c.out = appendRSTStream(c.out, st.id, http2.ErrCodeNo)
	}
	c.drop(st)
}

// drop forgets a stream without writing anything: its timer stops and its
// relay ends.
func (c *conn) drop(st *stream) {
	if st.done {
		return
	}
	st.done = true
	delete(c.streams, st.id)
	if st.relay == nil {
		c.open-- // a relayed call's count ends with its goroutines
	}
	c.closedIDs[c.closedAt] = closedID{st.id, !st.recvDone}
	c.closedAt = (c.closedAt + 1) % len(c.closedIDs)
	delete(c.blocked, st)
	if st.timer != nil {
		st.timer.Stop()
	}
	if st.cancel != nil {
		st.cancel()
	}
	if st.relay != nil {
		st.relay.close()
	}
	st.msg, st.pend = nil, nil
	c.windowed.Broadcast()
	if c.goneAway && len(c.streams) == 0 {
		c.closeAfter = true
	}
}

// used gives n bytes the client sent back to its connection window, in
// batches of a quarter of it. Called as DATA arrives.
func (c *conn) used(n int64) {
	if n <= 0 {
		return
	}
	if c.recvCredit += n; c.recvCredit >= connWindow/4 {
		c.out = appendWindowUpdate(c.out, 0, uint32(c.recvCredit))
		c.recvWin += c.recvCredit
		c.recvCredit = 0
	}
}

// pump sends what a stream has waiting, as far as the windows allow, then its
// trailers once nothing is left.
func (c *conn) pump(st *stream) {
	for len(st.pend) > 0 {
		n := min(int64(len(st.pend)), c.sendWin, st.sendWin, int64(c.peerFrame))
		if n <= 0 {
			c.blocked[st] = struct{}{}
			return
		}
		c.sent()
		c.out = appendFrameHeader(c.out, int(n), http2.FrameData, 0, st.id)
		c.out = append(c.out, st.pend[:n]...)
		st.pend = st.pend[n:]
		c.sendWin -= n
		st.sendWin -= n
		if len(st.pend) <= relayPending {
			c.windowed.Broadcast() // a relayed call's sender may go on
		}
	}
	st.pend = nil
	c.windowed.Broadcast()
	delete(c.blocked, st)
	switch {
	case st.trailers != nil:
		c.trail(st, st.trailers)
	case st.endData:
		c.out = appendFrameHeader(c.out, 0, http2.FrameData, http2.FlagDataEndStream, st.id)
		c.forget(st)
	}
}
