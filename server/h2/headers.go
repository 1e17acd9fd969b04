package h2

// A stream's HEADERS: RFC 9113's rules for a request's header block (§8.2,
// §8.3) in one place, and the gRPC mapping of a well-formed request (its
// method, deadline, encoding, and whether this server answers it or relays
// it) in another.

import (
	"fmt"
	"strconv"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
)

// headers opens a stream, or ends one with trailers from the client.
func (c *conn) headers(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	if id%2 == 0 {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if f.HasPriority() && f.Priority.StreamDep == id {
		// A stream depending on itself (RFC 9113, 5.3.1).
		c.lastStream = max(c.lastStream, id)
		if st := c.streams[id]; st != nil {
			c.drop(st) // trailers on an open stream: it ends here
		}
		c.reset(id, http2.ErrCodeProtocol)
		return nil
	}
	if id <= c.lastStream {
		return c.laterHeaders(id, f)
	}
	c.lastStream = id
	c.pingStrikes = 0
	if c.open >= MaxConcurrentStreams && len(c.streams) < MaxConcurrentStreams {
		c.waitSlot()
	}
	if c.goneAway || c.closed || c.open >= MaxConcurrentStreams {
		c.reset(id, http2.ErrCodeRefusedStream)
		return nil
	}
	h, ok := readHead(f.Fields)
	if !ok {
		c.reset(id, http2.ErrCodeProtocol)
		return nil
	}
	st := &stream{id: id, sendWin: c.peerWin, recvWin: streamWindow, recvDone: f.StreamEnded(), length: h.length}
	c.streams[id] = st
	c.open++
	if !h.complete(st.recvDone) {
		c.drop(st)
		c.out = appendRSTStream(c.out, id, http2.ErrCodeProtocol)
		return nil
	}
	c.openCall(st, h, f.Truncated)
	return nil
}

// laterHeaders takes a HEADERS frame on a stream already opened: the
// client's trailers on an open stream, or a frame on a closed one.
func (c *conn) laterHeaders(id uint32, f *http2.MetaHeadersFrame) error {
	if st := c.streams[id]; st != nil {
		return c.trailersIn(st, f)
	}
	switch known, mayFrame := c.closedState(id); {
	case known && mayFrame:
		return nil // trailers after this server reset the stream
	case known:
		return http2.ConnectionError(http2.ErrCodeStreamClosed)
	default:
		return http2.ConnectionError(http2.ErrCodeProtocol) // a stream ID going backwards
	}
}

// requestHead is what a request's header block says that this server acts
// on.
type requestHead struct {
	path, method, scheme, contentType string
	timeout, encoding                 string // grpc-timeout and grpc-encoding
	length                            int64  // content-length; -1 when absent
	size                              int    // the header list's size, as RFC 9113 counts it (6.5.2)
}

// readHead reads a request's header fields. ok is false when a field makes
// the request malformed (RFC 9113, 8.2.2 and 8.1.1): a connection-specific
// field, a te other than "trailers", or a content-length that is not a
// number or disagrees with another.
func readHead(fields []hpack.HeaderField) (h requestHead, ok bool) {
	h.length = -1
	for _, hf := range fields {
		h.size += len(hf.Name) + len(hf.Value) + 32
		switch hf.Name {
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
			return h, false
		case "te":
			if hf.Value != "trailers" {
				return h, false
			}
		case "content-length":
			n, err := strconv.ParseUint(hf.Value, 10, 63)
			if err != nil || (h.length >= 0 && int64(n) != h.length) {
				return h, false
			}
			h.length = int64(n)
		case ":scheme":
			h.scheme = hf.Value
		case ":path":
			h.path = hf.Value
		case ":method":
			h.method = hf.Value
		case "content-type":
			h.contentType = hf.Value
		case "grpc-timeout":
			h.timeout = hf.Value
		case "grpc-encoding":
			h.encoding = hf.Value
		}
	}
	return h, true
}

// complete reports whether a request has the pseudo-header fields every
// request needs (RFC 9113, 8.3.1), and, when its headers end it, declares
// no content it did not send (8.1.1).
func (h *requestHead) complete(ended bool) bool {
	return h.path != "" && h.method != "" && h.scheme != "" && !(ended && h.length > 0)
}

// openCall maps a well-formed request onto a gRPC call: anything but a gRPC
// POST gets an HTTP status, and a call whose headers already decide its end
// (too large, a malformed or expired deadline, a compressed message) ends
// here; ShouldRateLimit waits for its message, any other method is relayed.
func (c *conn) openCall(st *stream, h requestHead, truncated bool) {
	switch {
	case h.method != "POST":
		st.notGRPC, st.head = "405", h.method == "HEAD"
	case !isGRPC(h.contentType):
		st.notGRPC = "415"
	}
	if st.notGRPC != "" {
		// Answered once the client has sent the whole request, as HTTP
		// servers do.
		if st.recvDone {
			c.refuse(st)
		}
		return
	}
	if truncated || h.size > maxHeaderList {
		c.finish(st, codes.ResourceExhausted, fmt.Sprintf("header list larger than %d bytes", maxHeaderList))
		return
	}
	if h.timeout != "" && !c.setDeadline(st, h.timeout, h.path == Path) {
		return
	}
	if h.encoding != "" && h.encoding != "identity" {
		c.finish(st, codes.Unimplemented, fmt.Sprintf("grpc: Decompressor is not installed for grpc-encoding %q", h.encoding))
		return
	}
	if h.path != Path {
		c.startRelay(st, h.path)
		return
	}
	if st.recvDone {
		c.finish(st, codes.Internal, errNoMessage)
	}
}

// setDeadline gives a call the deadline its grpc-timeout asks for. It
// reports false when that ends the call: a malformed timeout, or one that
// has expired already. A ShouldRateLimit request still arriving is watched
// from the next batch of reads on (armDeadlines).
func (c *conn) setDeadline(st *stream, timeout string, answeredHere bool) bool {
	d, err := parseTimeout(timeout)
	if err != nil {
		// As grpc-go: HTTP 400 with the gRPC status.
		st.sentHead = true
		c.reply(st, appendStatusFields(appendNeverIndexed(appendNeverIndexed(nil, ":status", "400"), "content-type", "application/grpc"),
			codes.Internal, "malformed grpc-timeout: "+err.Error()))
		return false
	}
	if d <= 0 {
		// Expired already: never decided, so it spends no token.
		c.finish(st, codes.DeadlineExceeded, errDeadline)
		return false
	}
	st.deadline, st.timed = time.Now().Add(d), true
	if !st.recvDone && answeredHere {
		c.arriving = append(c.arriving, st)
	}
	return true
}

// trailersIn takes a HEADERS frame on an open stream: the client's trailers,
// which end its side.
func (c *conn) trailersIn(st *stream, f *http2.MetaHeadersFrame) error {
	switch {
	case st.recvDone:
		c.drop(st)
		c.out = appendRSTStream(c.out, st.id, http2.ErrCodeStreamClosed)
	case !f.StreamEnded():
		return http2.ConnectionError(http2.ErrCodeProtocol)
	case len(f.PseudoFields()) > 0 || (st.length >= 0 && st.got != st.length):
		c.drop(st)
		c.out = appendRSTStream(c.out, st.id, http2.ErrCodeProtocol)
	default:
		c.endRecv(st)
	}
	return nil
}

// isGRPC reports whether a content-type is gRPC's: application/grpc, alone
// or with a subtype.
func isGRPC(ct string) bool {
	const g = "application/grpc"
	if len(ct) < len(g) || ct[:len(g)] != g {
		return false
	}
	return len(ct) == len(g) || ct[len(g)] == '+' || ct[len(g)] == ';'
}
