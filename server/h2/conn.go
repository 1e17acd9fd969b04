package h2

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
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
	freed      *sync.Cond           // signalled when a relayed call stops counting against the stream limit, or the connection ends
	sendWin    int64                // the peer's connection window for us
	peerWin    int64                // the peer's initial stream window
	peerFrame  int                  // the largest frame the peer accepts
	recvWin    int64                // what the peer may still send on the connection
	recvCredit int64                // bytes received, not yet given back to the peer
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
	// arriving are the streams opened with a deadline since the last batch
	// of reads; those still waiting for their request then get a timer
	// (armDeadlines). A request that arrives within its batch, as nearly
	// all do, costs no timer.
	arriving []*stream
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
	msg      []byte      // the request so far, when it spans frames
	pend     []byte      // DATA payload waiting for the send window
	trailers []byte      // the trailer block, once the answer is complete
	deadline time.Time   // the client's grpc-timeout, from when its headers arrived
	timed    bool        // deadline is set
	timer    *time.Timer // the deadline of a request still arriving, or a wait policy's answer
	cancel   context.CancelFunc
	recvDone bool // the client ended its side
	sentHead bool
	endData  bool // the stream ends with its last DATA frame, not trailers
	// notGRPC is the HTTP status a request that is not gRPC gets once the
	// client has sent it all: 405 or 415.
	notGRPC string
	head    bool // the request is a HEAD: its refusal has no body
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
	c.freed = sync.NewCond(&c.wmu)
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
	var ge goAwayError
	switch {
	case errors.As(err, &ge):
		c.fail(ge.code, ge.debug)
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
	c.br = bufio.NewReaderSize(sockReader{c}, readBuffer)
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
	// The Framer decodes (and bounds each string to) maxHeaderDecode; the
	// smaller maxHeaderList is checked per call, in headers.
	c.fr.MaxHeaderListSize = maxHeaderDecode
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
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

// sockReader is the connection as the Framer's buffered reader reads it.
// Before each read of the socket, which may block, what the frames read so
// far produced goes out (answers, WINDOW_UPDATEs, PING ACKs) and the
// deadlines of calls still waiting for their requests are armed. A read
// also blocks in the middle of a frame whose bytes are still arriving:
// were the output held until then, an answer decided in time would reach
// the client after its deadline, its token spent, and a window the client
// waits for would not open.
type sockReader struct{ c *conn }

func (r sockReader) Read(p []byte) (int, error) {
	if r.c.ready {
		r.c.armDeadlines()
		if err := r.c.flush(); err != nil {
			return 0, err
		}
	}
	return r.c.nc.Read(p)
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
	c.freed.Broadcast()
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
		// What the frames read so far produced goes out before the socket
		// is read again (sockReader).
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
			c.armDeadlines()
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
