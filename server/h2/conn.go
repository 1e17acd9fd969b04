package h2

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/sharelimit/sharelimit/server/wire"
)

// Sizes of the connection's buffers.
const (
	readBuffer = 64 << 10
	// flushAt is how large the output may grow within one batch of reads
	// before it is written out anyway.
	flushAt = 64 << 10
	// relayPending bounds what a relayed call may have waiting for the
	// peer's flow-control window before its sender waits.
	relayPending = 256 << 10
)

// keepalivePing is the payload of a keepalive PING.
var keepalivePing = [8]byte{'s', 'l', 'k', 'e', 'e', 'p', 'a', 'l'}

// goAwayPing is the payload of the PING sent with the first GOAWAY of a
// graceful stop: its acknowledgement says the client has seen that GOAWAY,
// so the last stream it opened before is known.
var goAwayPing = [8]byte{'s', 'l', 'g', 'o', 'a', 'w', 'a', 'y'}

// conn is one client connection. Its reader goroutine owns the Framer and
// the fields marked reader-only; everything else is guarded by wmu.
type conn struct {
	s   *Server
	raw net.Conn        // the accepted connection, for closing
	nc  net.Conn        // raw, or the TLS connection over it once the handshake is done
	ctx context.Context // ends when the connection does
	end context.CancelFunc
	// goroutines counts what runs for this connection besides its reader:
	// relays, and a graceful stop's write.
	goroutines sync.WaitGroup

	// Reader-only.
	br         *bufio.Reader
	fr         *http2.Framer
	lastStream uint32 // the highest stream a client opened
	headersErr error  // a header field's error, found while decoding

	flushMu sync.Mutex // one socket write at a time

	wmu        sync.Mutex
	out        []byte // frames to write
	spare      []byte // the buffer the last write used, for reuse
	closed     bool   // the connection is over: nothing more is written
	closeAfter bool   // close the connection once out is written
	streams    map[uint32]*stream
	blocked    map[*stream]struct{} // streams with data waiting for window
	windowed   *sync.Cond           // signalled when send window opens or the connection ends
	sendWin    int64                // the peer's connection window for us
	peerWin    int64                // the peer's initial stream window
	peerFrame  int                  // the largest frame the peer accepts
	recvWin    int64                // what the peer may still send on the connection
	recvCredit int64                // bytes used, not yet given back to the peer
	sizeUpdate bool                 // the next header block starts with a table size update
	goingAway  bool                 // the first GOAWAY of a graceful stop is sent
	goneAway   bool                 // the final GOAWAY is sent: no new streams
	goAwayLast uint32
	// reads counts the frames read, for keepalive to see a live peer.
	reads atomic.Uint64
	// ready is set once the handshake is done and this server's SETTINGS
	// are written: nothing else is written before.
	ready bool
	// open counts the streams held against MaxConcurrentStreams: those in
	// streams, and relayed calls whose goroutines have not yet ended.
	open int
	// pingStrikes counts PINGs that came too soon (pingInterval) after
	// the last, with no request in between, as grpc-go's enforcement does.
	pingStrikes int
	lastPing    time.Time
	// closedIDs are the streams closed last, and whether the client may
	// still send on them: frames for a stream this server reset are
	// ignored, as RFC 9113 says; others are errors.
	closedIDs [256]closedID
	closedAt  int
}

type closedID struct {
	id       uint32
	mayFrame bool
}

// closedState reports whether id is among the streams closed last, and
// whether the client may still send frames on it.
func (c *conn) closedState(id uint32) (known, mayFrame bool) {
	for _, x := range c.closedIDs {
		if x.id == id {
			return true, x.mayFrame
		}
	}
	return false, false
}

// stream is one call. Guarded by its connection's wmu.
type stream struct {
	id       uint32
	relay    *inbox // nil for ShouldRateLimit, answered here
	sendWin  int64
	recvWin  int64
	held     int64       // bytes received and not yet used: not given back to the connection window
	credit   int64       // relayed bytes used, not yet given back to the stream window
	msg      []byte      // the request so far, when it spans frames
	pend     []byte      // DATA payload waiting for the send window
	trailers []byte      // the trailer block, once the answer is complete
	deadline time.Time   // the client's grpc-timeout, from when its headers arrived
	timed    bool        // deadline is set
	timer    *time.Timer // a wait policy's answer, or its deadline
	cancel   context.CancelFunc
	recvDone bool // the client ended its side
	sentHead bool
	endData  bool // the stream ends with its last DATA frame, not trailers
	// notGRPC is the HTTP status a request that is not gRPC gets once the
	// client has sent it all: 405 or 415.
	notGRPC string
	// length is the request's content-length, -1 without one; got counts
	// the DATA bytes against it.
	length, got int64
	done        bool // the answer is complete and the stream forgotten
}

func newConn(s *Server, nc net.Conn) *conn {
	c := &conn{
		s: s, raw: nc, nc: nc,
		streams:   map[uint32]*stream{},
		blocked:   map[*stream]struct{}{},
		sendWin:   65535,
		peerWin:   65535,
		peerFrame: 16384,
		recvWin:   connWindow,
	}
	c.windowed = sync.NewCond(&c.wmu)
	c.ctx, c.end = context.WithCancel(context.Background())
	return c
}

// errClientPreface is a connection that is not HTTP/2 with prior knowledge.
var errClientPreface = errors.New("h2: bad client preface")

// serve runs the connection until it ends, and then waits for everything it
// started.
func (c *conn) serve() {
	defer c.s.forget(c)
	defer c.goroutines.Wait()
	defer c.shut()
	defer func() {
		if p := recover(); p != nil {
			// The request path recovers its own panics; this is the
			// transport's, and ends only this connection.
			c.s.log.Error("recovered panic in the HTTP/2 transport; connection closed", "panic", p)
		}
	}()
	if err := c.handshake(); err != nil {
		if !errors.Is(err, io.EOF) {
			c.s.log.Debug("connection refused before HTTP/2", "remote", c.raw.RemoteAddr().String(), "err", err)
		}
		return
	}
	c.goroutines.Add(1)
	go c.keepalive()
	err := c.readLoop()
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &ce):
		c.fail(http2.ErrCode(ce), err.Error())
	case errors.Is(err, http2.ErrFrameTooLarge):
		c.fail(http2.ErrCodeFrameSize, err.Error())
	case errors.Is(err, errClientPreface):
		c.fail(http2.ErrCodeProtocol, err.Error())
	}
}

// handshake does TLS when configured, reads the client preface and sends
// this server's settings.
func (c *conn) handshake() error {
	c.nc.SetDeadline(time.Now().Add(handshakeTimeout))
	if c.s.tls != nil {
		tc := tls.Server(c.nc, c.s.tls)
		if err := tc.Handshake(); err != nil {
			return err
		}
		if p := tc.ConnectionState().NegotiatedProtocol; p != "h2" {
			return fmt.Errorf("h2: TLS client negotiated %q, not h2", p)
		}
		c.nc = tc
	}
	c.br = bufio.NewReaderSize(c.nc, readBuffer)
	var preface [len(http2.ClientPreface)]byte
	if _, err := io.ReadFull(c.br, preface[:]); err != nil {
		return err
	}
	if string(preface[:]) != http2.ClientPreface {
		return errClientPreface
	}
	c.nc.SetDeadline(time.Time{})
	c.fr = http2.NewFramer(nil, c.br)
	c.fr.SetReuseFrames()
	c.fr.SetMaxReadFrameSize(16384)
	c.fr.MaxHeaderListSize = maxHeaderList
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.fr.ReadMetaHeaders.SetMaxStringLength(maxHeaderList)
	c.wmu.Lock()
	c.out = appendSettings(c.out,
		http2.Setting{ID: http2.SettingMaxConcurrentStreams, Val: MaxConcurrentStreams},
		http2.Setting{ID: http2.SettingInitialWindowSize, Val: streamWindow},
		http2.Setting{ID: http2.SettingMaxHeaderListSize, Val: maxHeaderList},
	)
	c.out = appendWindowUpdate(c.out, 0, connWindow-65535)
	c.ready = true
	c.wmu.Unlock()
	return c.flush()
}

// shut ends the connection: every stream ends, every waiting sender wakes.
func (c *conn) shut() {
	c.end()
	c.wmu.Lock()
	c.closed = true
	for _, st := range c.streams {
		c.drop(st)
	}
	c.windowed.Broadcast()
	c.wmu.Unlock()
	c.raw.Close()
}

// fail sends a GOAWAY with code, best effort, before the connection closes.
func (c *conn) fail(code http2.ErrCode, why string) {
	c.wmu.Lock()
	c.out = appendGoAway(c.out, c.lastStream, code, why)
	c.wmu.Unlock()
	c.flush()
}

// readLoop reads and handles frames until the connection ends.
func (c *conn) readLoop() error {
	first := true
	for {
		if c.br.Buffered() == 0 {
			// Everything read so far is handled: write what it produced
			// before waiting for more.
			if err := c.flush(); err != nil {
				return err
			}
		}
		f, err := c.fr.ReadFrame()
		c.reads.Add(1)
		if err != nil {
			var se http2.StreamError
			if errors.As(err, &se) {
				c.streamError(se)
				continue
			}
			return err
		}
		if first {
			// The client preface ends with a SETTINGS frame.
			if sf, ok := f.(*http2.SettingsFrame); !ok || sf.IsAck() {
				return errClientPreface
			}
			first = false
		}
		if err := c.handle(f); err != nil {
			return err
		}
		c.wmu.Lock()
		big, quit := len(c.out) >= flushAt, c.closeAfter && len(c.streams) == 0
		c.wmu.Unlock()
		if quit {
			return c.flush()
		}
		if big {
			if err := c.flush(); err != nil {
				return err
			}
		}
	}
}

// handle handles one frame; an error ends the connection.
func (c *conn) handle(f http2.Frame) error {
	switch f := f.(type) {
	case *http2.MetaHeadersFrame:
		return c.headers(f)
	case *http2.DataFrame:
		return c.data(f)
	case *http2.SettingsFrame:
		return c.settings(f)
	case *http2.WindowUpdateFrame:
		return c.windowUpdate(f)
	case *http2.PingFrame:
		return c.ping(f)
	case *http2.RSTStreamFrame:
		c.wmu.Lock()
		defer c.wmu.Unlock()
		if f.StreamID > c.lastStream {
			return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
		}
		if st := c.streams[f.StreamID]; st != nil {
			st.recvDone = true // the client sends nothing more on it
			c.drop(st)
		}
	case *http2.PriorityFrame:
		if f.StreamDep == f.StreamID {
			c.wmu.Lock()
			defer c.wmu.Unlock()
			if st := c.streams[f.StreamID]; st != nil {
				c.drop(st)
			}
			c.out = appendRSTStream(c.out, f.StreamID, http2.ErrCodeProtocol)
		}
	case *http2.GoAwayFrame:
		// The client opens no more streams; those open finish.
	case *http2.PushPromiseFrame:
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	// PRIORITY and unknown frame types are ignored, as RFC 9113 says.
	return nil
}

// reset refuses or resets a stream that holds no state: it is remembered
// among the closed ones, and frames the client sent before it saw the reset
// are ignored. Called with wmu held.
func (c *conn) reset(id uint32, code http2.ErrCode) {
	c.out = appendRSTStream(c.out, id, code)
	c.closedIDs[c.closedAt] = closedID{id, true}
	c.closedAt = (c.closedAt + 1) % len(c.closedIDs)
}

// streamError resets the stream a Framer found at fault.
func (c *conn) streamError(se http2.StreamError) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if se.StreamID > c.lastStream && se.StreamID%2 == 1 {
		c.lastStream = se.StreamID
	}
	if st := c.streams[se.StreamID]; st != nil {
		c.drop(st)
	}
	c.out = appendRSTStream(c.out, se.StreamID, se.Code)
}

// headers opens a stream, or ends one with trailers from the client.
func (c *conn) headers(f *http2.MetaHeadersFrame) error {
	id := f.StreamID
	if id%2 == 0 {
		return http2.ConnectionError(http2.ErrCodeProtocol)
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if f.HasPriority() && f.Priority.StreamDep == id {
		c.lastStream = max(c.lastStream, id)
		c.reset(id, http2.ErrCodeProtocol)
		return nil
	}
	if id <= c.lastStream {
		st := c.streams[id]
		if st == nil {
			switch known, mayFrame := c.closedState(id); {
			case known && mayFrame:
				return nil // trailers after this server reset the stream
			case known:
				return http2.ConnectionError(http2.ErrCodeStreamClosed)
			default:
				return http2.ConnectionError(http2.ErrCodeProtocol) // a stream ID going backwards
			}
		}
		return c.trailersIn(st, f)
	}
	c.lastStream = id
	c.pingStrikes = 0
	if c.goneAway || c.closed || c.open >= MaxConcurrentStreams {
		c.reset(id, http2.ErrCodeRefusedStream)
		return nil
	}
	var path, method, scheme, contentType, timeout, encoding string
	length := int64(-1)
	for _, hf := range f.Fields {
		switch hf.Name {
		case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
			// Connection-specific: malformed in HTTP/2 (RFC 9113, 8.2.2).
			c.reset(id, http2.ErrCodeProtocol)
			return nil
		case "te":
			if hf.Value != "trailers" {
				c.reset(id, http2.ErrCodeProtocol)
				return nil
			}
		case ":scheme":
			scheme = hf.Value
		case "content-length":
			n, err := strconv.ParseUint(hf.Value, 10, 63)
			if err != nil || (length >= 0 && int64(n) != length) {
				c.reset(id, http2.ErrCodeProtocol)
				return nil
			}
			length = int64(n)
		case ":path":
			path = hf.Value
		case ":method":
			method = hf.Value
		case "content-type":
			contentType = hf.Value
		case "grpc-timeout":
			timeout = hf.Value
		case "grpc-encoding":
			encoding = hf.Value
		}
	}
	st := &stream{id: id, sendWin: c.peerWin, recvWin: streamWindow, recvDone: f.StreamEnded(), length: length}
	c.streams[id] = st
	c.open++
	switch {
	case path == "" || method == "" || scheme == "" || (st.recvDone && length > 0):
		c.drop(st)
		c.out = appendRSTStream(c.out, id, http2.ErrCodeProtocol)
		return nil
	case method != "POST":
		st.notGRPC = "405"
	case !isGRPC(contentType):
		st.notGRPC = "415"
	}
	if st.notGRPC != "" {
		// Answered once the client has sent the whole request, as HTTP
		// servers do.
		if st.recvDone {
			c.refuse(st)
		}
		return nil
	}
	switch {
	case f.Truncated:
		c.finish(st, codes.ResourceExhausted, fmt.Sprintf("header list larger than %d bytes", maxHeaderList))
		return nil
	}
	if timeout != "" {
		d, err := parseTimeout(timeout)
		if err != nil {
			// As grpc-go: HTTP 400 with the gRPC status.
			st.sentHead = true
			c.reply(st, appendStatusFields(appendNeverIndexed(appendNeverIndexed(nil, ":status", "400"), "content-type", "application/grpc"),
				codes.Internal, "malformed grpc-timeout: "+err.Error()))
			return nil
		}
		st.deadline, st.timed = time.Now().Add(d), true
	}
	if encoding != "" && encoding != "identity" {
		c.finish(st, codes.Unimplemented, fmt.Sprintf("grpc: Decompressor is not installed for grpc-encoding %q", encoding))
		return nil
	}
	if path != Path {
		c.startRelay(st, path)
		return nil
	}
	if st.recvDone {
		c.finish(st, codes.Internal, errNoMessage)
	}
	return nil
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

const errNoMessage = "cardinality violation: received no request message from non-client-streaming RPC"

// isGRPC reports whether a content-type is gRPC's: application/grpc, alone
// or with a subtype.
func isGRPC(ct string) bool {
	const g = "application/grpc"
	if len(ct) < len(g) || ct[:len(g)] != g {
		return false
	}
	return len(ct) == len(g) || ct[len(g)] == '+' || ct[len(g)] == ';'
}

// data takes a DATA frame: flow control first, then the stream's message.
func (c *conn) data(f *http2.DataFrame) error {
	n := int64(f.Header().Length)
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.recvWin -= n; c.recvWin < 0 {
		return http2.ConnectionError(http2.ErrCodeFlowControl)
	}
	st := c.streams[f.StreamID]
	if st == nil || st.recvDone {
		if f.StreamID > c.lastStream {
			return http2.ConnectionError(http2.ErrCodeProtocol) // an idle stream
		}
		c.used(n)
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
		c.used(n)
		return nil
	}
	data := f.Data()
	if pad := n - int64(len(data)); pad > 0 {
		// Padding is used as it arrives: back to both windows at once,
		// so that a padded request never runs out of stream window.
		c.used(pad)
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
		c.used(int64(len(data)))
		c.drop(st)
		c.out = appendRSTStream(c.out, st.id, http2.ErrCodeProtocol)
		return nil
	}
	if st.notGRPC != "" {
		c.used(int64(len(data)))
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
	// The bytes go back to the connection window once the request is
	// decoded, or dropped: a connection holds at most connWindow bytes of
	// requests still arriving.
	st.held += int64(len(data))
	if len(msg) >= 5 {
		if msg[0] != 0 {
			// grpc-encoding, if any, was identity: checked with the headers.
			c.finish(st, codes.Internal, "grpc: compressed flag set with identity or empty encoding")
			return
		}
		if l := binary.BigEndian.Uint32(msg[1:5]); l > maxRecvMsg {
			c.finish(st, codes.ResourceExhausted, fmt.Sprintf("grpc: received message larger than max (%d vs. %d)", l, maxRecvMsg))
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
	c.used(st.held)
	st.held = 0
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

// answerLater holds an answer back for wait, or answers DeadlineExceeded at
// the client's deadline if that comes first.
func (c *conn) answerLater(st *stream, resp *rlsv3.RateLimitResponse, wait time.Duration) {
	late := false
	if st.timed {
		if left := time.Until(st.deadline); left < wait {
			late, wait = true, max(left, 0)
		}
	}
	st.timer = time.AfterFunc(wait, func() {
		c.wmu.Lock()
		if st.done || c.closed {
			c.wmu.Unlock()
			return
		}
		if late {
			c.finish(st, codes.DeadlineExceeded, "context deadline exceeded")
		} else {
			c.answer(st, resp)
		}
		c.wmu.Unlock()
		c.flush()
	})
}

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
	c.used(st.held)
	st.held = 0
	st.msg, st.pend = nil, nil
	c.windowed.Broadcast()
	if c.goneAway && len(c.streams) == 0 {
		c.closeAfter = true
	}
}

// used gives n bytes the client sent back to its connection window, in
// batches of a quarter of it.
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

// settings applies the client's settings and acknowledges them.
func (c *conn) settings(f *http2.SettingsFrame) error {
	if f.IsAck() {
		return nil
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerWin
			c.peerWin = int64(s.Val)
			for _, st := range c.streams {
				if st.sendWin += delta; st.sendWin > 1<<31-1 {
					return http2.ConnectionError(http2.ErrCodeFlowControl)
				}
			}
		case http2.SettingMaxFrameSize:
			c.peerFrame = int(s.Val)
		case http2.SettingHeaderTableSize:
			c.sizeUpdate = true
		}
		return nil
	})
	if err != nil {
		return err
	}
	c.out = appendSettingsAck(c.out)
	for st := range c.blocked {
		c.pump(st)
	}
	return nil
}

// windowUpdate opens the connection's or a stream's send window.
func (c *conn) windowUpdate(f *http2.WindowUpdateFrame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	inc := int64(f.Increment)
	if f.StreamID == 0 {
		if c.sendWin += inc; c.sendWin > 1<<31-1 {
			return http2.ConnectionError(http2.ErrCodeFlowControl)
		}
		for st := range c.blocked {
			c.pump(st)
		}
		return nil
	}
	st := c.streams[f.StreamID]
	if st == nil {
		if f.StreamID > c.lastStream {
			return http2.ConnectionError(http2.ErrCodeProtocol)
		}
		return nil
	}
	if st.sendWin += inc; st.sendWin > 1<<31-1 {
		c.drop(st)
		c.out = appendRSTStream(c.out, st.id, http2.ErrCodeFlowControl)
		return nil
	}
	if len(st.pend) > 0 {
		c.pump(st)
	}
	return nil
}

// keepalive closes a connection whose peer has gone silent, as grpc-go's
// server keepalive did for the daemon: after keepaliveTime with no frame read
// it sends a PING, and if still nothing has been read keepaliveTimeout later,
// it closes the connection. A peer that vanished without a FIN (a dead host,
// a dropped flow) would otherwise hold its connection and its calls forever.
func (c *conn) keepalive() {
	defer c.goroutines.Done()
	t := time.NewTimer(c.s.keepaliveTime)
	defer t.Stop()
	last, pinged := c.reads.Load(), false
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		switch now := c.reads.Load(); {
		case now != last:
			last, pinged = now, false
			t.Reset(c.s.keepaliveTime)
		case !pinged:
			c.wmu.Lock()
			if c.closed {
				c.wmu.Unlock()
				return
			}
			c.out = appendPing(c.out, keepalivePing, false)
			c.wmu.Unlock()
			// The write may block on a peer that no longer reads: it
			// gets its own goroutine, which the close below frees.
			c.goroutines.Add(1)
			go func() {
				defer c.goroutines.Done()
				c.flush()
			}()
			pinged = true
			t.Reset(c.s.keepaliveTimeout)
		default:
			c.s.log.Debug("closing a connection whose peer did not answer a keepalive PING", "remote", c.raw.RemoteAddr().String())
			c.raw.Close()
			return
		}
	}
}

// sent notes that an answer's frames went out: as in grpc-go, a client's
// PINGs are counted against it only while the connection is otherwise quiet
// (a client measuring the connection pings as data arrives).
func (c *conn) sent() {
	c.pingStrikes = 0
	c.lastPing = time.Time{}
}

// ping answers a PING; the acknowledgement of a graceful stop's own PING sends
// its final GOAWAY.
func (c *conn) ping(f *http2.PingFrame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !f.IsAck() {
		now := time.Now()
		if !c.lastPing.IsZero() && now.Sub(c.lastPing) < pingInterval {
			if c.pingStrikes++; c.pingStrikes > maxPingStrikes {
				return http2.ConnectionError(http2.ErrCodeEnhanceYourCalm)
			}
		}
		c.lastPing = now
		c.out = appendPing(c.out, f.Data, true)
		return nil
	}
	if f.Data == goAwayPing && c.goingAway {
		c.finalGoAway()
	}
	return nil
}

// goAway begins a graceful stop: a GOAWAY that allows every stream, and a
// PING. The client acknowledges the PING once it has read the GOAWAY; then
// finalGoAway names the last stream. A client that does not acknowledge
// within a second gets the final GOAWAY anyway.
func (c *conn) goAway() {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.goingAway || c.closed {
		return
	}
	if !c.ready {
		// Still in the handshake: nothing may be written yet, and a
		// client that has not begun has nothing in flight.
		c.raw.Close()
		return
	}
	c.goingAway = true
	c.out = appendGoAway(c.out, 1<<31-1, http2.ErrCodeNo, "")
	c.out = appendPing(c.out, goAwayPing, false)
	c.goroutines.Add(1)
	go func() {
		defer c.goroutines.Done()
		c.flush()
		t := time.NewTimer(time.Second)
		defer t.Stop()
		select {
		case <-t.C:
		case <-c.ctx.Done():
			return
		}
		c.wmu.Lock()
		c.finalGoAway()
		c.wmu.Unlock()
		c.flush()
	}()
}

// finalGoAway names the last stream this connection serves; once those are
// answered, it closes.
func (c *conn) finalGoAway() {
	if c.goneAway || c.closed {
		return
	}
	c.goneAway = true
	c.goAwayLast = c.lastStream
	c.out = appendGoAway(c.out, c.lastStream, http2.ErrCodeNo, "")
	if len(c.streams) == 0 {
		c.closeAfter = true
	}
}

// flush writes out what the connection has to send. A connection marked to
// close is closed once it is written.
func (c *conn) flush() error {
	c.flushMu.Lock()
	defer c.flushMu.Unlock()
	c.wmu.Lock()
	buf, closeAfter := c.out, c.closeAfter
	c.out, c.spare = c.spare[:0], nil
	c.wmu.Unlock()
	var err error
	if len(buf) > 0 {
		_, err = c.nc.Write(buf)
	}
	if cap(buf) <= 256<<10 {
		c.wmu.Lock()
		c.spare = buf[:0]
		c.wmu.Unlock()
	}
	if err != nil || closeAfter {
		c.raw.Close()
	}
	return err
}

// parseTimeout reads a grpc-timeout: up to eight digits and a unit. Its
// errors read as grpc-go's, which clients may already match on.
func parseTimeout(s string) (time.Duration, error) {
	switch {
	case len(s) < 2:
		return 0, fmt.Errorf("transport: timeout string is too short: %q", s)
	case len(s) > 9:
		return 0, fmt.Errorf("transport: timeout string is too long: %q", s)
	}
	var unit time.Duration
	switch s[len(s)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, fmt.Errorf("transport: timeout unit is not recognized: %q", s)
	}
	v, err := strconv.ParseUint(s[:len(s)-1], 10, 64)
	if err != nil {
		return 0, err
	}
	if v > uint64(1<<63-1)/uint64(unit) {
		return 1<<63 - 1, nil
	}
	return time.Duration(v) * unit, nil
}

// refusal is the body of an answer to a request that is not gRPC.
const refusal = "sharelimit serves gRPC here: POST with content-type application/grpc\n"

// refuse answers a request that is not gRPC with its HTTP status.
func (c *conn) refuse(st *stream) {
	st.sentHead = true
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
