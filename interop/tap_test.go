package interop

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// tap is a TCP relay in front of a daemon that reads the cleartext HTTP/2
// frames it passes on, in both directions, and changes nothing. It records
// what the clients and the daemon did on the wire: connections, frames,
// GOAWAYs, resets, the daemon's SETTINGS, and every ShouldRateLimit answer
// (headers, body and trailers), which it decodes for the clients that do not
// (h2load, nghttp).
type tap struct {
	t      *testing.T
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex
	conns []*tapConn
	open  []net.Conn
}

type tapConn struct {
	opened   time.Time
	frames   []frameEvent
	streams  map[uint32]*tapStream
	settings map[http2.SettingID]uint32 // the daemon's, as sent
	goaways  []goaway
	errs     []error // what the tap could not parse (it relays on regardless)
}

type frameEvent struct {
	at         time.Time
	fromClient bool
	typ        http2.FrameType
	flags      http2.Flags
	stream     uint32
	length     int
}

type goaway struct {
	fromClient bool
	code       http2.ErrCode
	debug      string
}

// tapStream is one stream: the request's headers and what the daemon sent.
type tapStream struct {
	id                    uint32
	path                  string
	reqHeaderBytes        int // the header list's size as HTTP/2 counts it
	respHeaders, trailers []hpack.HeaderField
	body                  []byte
	clientData            int       // DATA bytes the client sent
	firstClientData       time.Time // zero: the client sent no DATA
	serverEnd             time.Time // END_STREAM or RST_STREAM from the daemon
	rstByClient           bool
	rstByServer           *http2.ErrCode
}

// newTap relays a fresh loopback port to target until t ends.
func newTap(t *testing.T, target string) *tap {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tp := &tap{t: t, ln: ln, target: target}
	tp.wg.Add(1)
	go tp.accept()
	t.Cleanup(tp.close)
	return tp
}

// addr is where clients connect.
func (tp *tap) addr() string { return tp.ln.Addr().String() }

func (tp *tap) url() string { return "http://" + tp.addr() + rlsPath }

func (tp *tap) close() {
	tp.ln.Close()
	tp.mu.Lock()
	for _, c := range tp.open {
		c.Close()
	}
	tp.mu.Unlock()
	tp.wg.Wait()
}

func (tp *tap) accept() {
	defer tp.wg.Done()
	for {
		cc, err := tp.ln.Accept()
		if err != nil {
			return
		}
		sc, err := net.Dial("tcp", tp.target)
		if err != nil {
			cc.Close()
			continue
		}
		c := &tapConn{opened: time.Now(), streams: map[uint32]*tapStream{}, settings: map[http2.SettingID]uint32{}}
		tp.mu.Lock()
		tp.conns = append(tp.conns, c)
		tp.open = append(tp.open, cc, sc)
		tp.mu.Unlock()
		var both sync.WaitGroup
		both.Add(2)
		tp.wg.Add(2)
		go tp.relay(c, sc, cc, true, &both)
		go tp.relay(c, cc, sc, false, &both)
		go func() {
			both.Wait()
			cc.Close()
			sc.Close()
		}()
	}
}

// relay copies src to dst, reading the frames on the way. The end of src is
// passed on as the end of dst's writing side, so a half-closed connection
// stays half open, as it would without the tap.
func (tp *tap) relay(c *tapConn, dst, src net.Conn, fromClient bool, both *sync.WaitGroup) {
	defer tp.wg.Done()
	defer both.Done()
	p := &frameParser{c: c, fromClient: fromClient, dec: hpack.NewDecoder(4096, nil)}
	p.dec.SetAllowedMaxDynamicTableSize(1 << 24)
	if fromClient {
		p.pre = len(http2.ClientPreface)
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			tp.mu.Lock()
			p.feed(buf[:n])
			tp.mu.Unlock()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				src.Close()
				return
			}
		}
		if errors.Is(err, io.EOF) {
			dst.(*net.TCPConn).CloseWrite()
			return
		}
		if err != nil {
			dst.Close()
			return
		}
	}
}

// frameParser reads frames from one direction's bytes as they come.
type frameParser struct {
	c          *tapConn
	fromClient bool
	dec        *hpack.Decoder
	broken     bool

	pre     int // client preface bytes still to skip
	hdr     [9]byte
	nh      int
	typ     http2.FrameType
	flags   http2.Flags
	stream  uint32
	length  int
	left    int
	keep    bool
	payload []byte

	block       []byte // a header block being gathered
	blockEnd    bool   // END_STREAM on the HEADERS frame that began it
	blockStream uint32
}

func (p *frameParser) feed(b []byte) {
	for len(b) > 0 && !p.broken {
		switch {
		case p.pre > 0:
			n := min(p.pre, len(b))
			p.pre -= n
			b = b[n:]
		case p.nh < len(p.hdr):
			n := copy(p.hdr[p.nh:], b)
			p.nh += n
			b = b[n:]
			if p.nh < len(p.hdr) {
				return
			}
			p.length = int(p.hdr[0])<<16 | int(p.hdr[1])<<8 | int(p.hdr[2])
			p.typ, p.flags = http2.FrameType(p.hdr[3]), http2.Flags(p.hdr[4])
			p.stream = binary.BigEndian.Uint32(p.hdr[5:]) & (1<<31 - 1)
			p.left = p.length
			// A request's DATA is only counted: it can be megabytes.
			p.keep = !(p.fromClient && p.typ == http2.FrameData)
			p.payload = p.payload[:0]
			if p.left == 0 {
				p.done()
			}
		default:
			n := min(p.left, len(b))
			if p.keep {
				p.payload = append(p.payload, b[:n]...)
			}
			p.left -= n
			b = b[n:]
			if p.left == 0 {
				p.done()
			}
		}
	}
}

func (p *frameParser) fail(format string, args ...any) {
	p.c.errs = append(p.c.errs, fmt.Errorf(format, args...))
	p.broken = true
}

func (c *tapConn) stream(id uint32) *tapStream {
	s := c.streams[id]
	if s == nil {
		s = &tapStream{id: id}
		c.streams[id] = s
	}
	return s
}

// done handles the frame just read.
func (p *frameParser) done() {
	p.nh = 0
	now := time.Now()
	c := p.c
	c.frames = append(c.frames, frameEvent{at: now, fromClient: p.fromClient, typ: p.typ, flags: p.flags, stream: p.stream, length: p.length})
	pl := p.payload
	switch p.typ {
	case http2.FrameData:
		s := c.stream(p.stream)
		if p.fromClient {
			s.clientData += p.length
			if s.firstClientData.IsZero() {
				s.firstClientData = now
			}
			return
		}
		if p.flags.Has(http2.FlagDataPadded) {
			if len(pl) < 1 || int(pl[0]) >= len(pl) {
				p.fail("stream %d: bad padding", p.stream)
				return
			}
			pl = pl[1 : len(pl)-int(pl[0])]
		}
		s.body = append(s.body, pl...)
		if p.flags.Has(http2.FlagDataEndStream) {
			s.serverEnd = now
		}
	case http2.FrameHeaders:
		if p.flags.Has(http2.FlagHeadersPadded) {
			if len(pl) < 1 || int(pl[0]) >= len(pl) {
				p.fail("stream %d: bad padding", p.stream)
				return
			}
			pl = pl[1 : len(pl)-int(pl[0])]
		}
		if p.flags.Has(http2.FlagHeadersPriority) {
			if len(pl) < 5 {
				p.fail("stream %d: short priority", p.stream)
				return
			}
			pl = pl[5:]
		}
		p.block = append(p.block[:0], pl...)
		p.blockStream = p.stream
		p.blockEnd = p.flags.Has(http2.FlagHeadersEndStream)
		if p.flags.Has(http2.FlagHeadersEndHeaders) {
			p.endBlock(now)
		}
	case http2.FrameContinuation:
		p.block = append(p.block, pl...)
		if p.flags.Has(http2.FlagContinuationEndHeaders) {
			p.endBlock(now)
		}
	case http2.FrameRSTStream:
		if len(pl) != 4 {
			p.fail("RST_STREAM of %d bytes", len(pl))
			return
		}
		s := c.stream(p.stream)
		if p.fromClient {
			s.rstByClient = true
		} else {
			code := http2.ErrCode(binary.BigEndian.Uint32(pl))
			s.rstByServer = &code
			if s.serverEnd.IsZero() {
				s.serverEnd = now
			}
		}
	case http2.FrameSettings:
		if p.fromClient || p.flags.Has(http2.FlagSettingsAck) {
			return
		}
		for i := 0; i+6 <= len(pl); i += 6 {
			c.settings[http2.SettingID(binary.BigEndian.Uint16(pl[i:]))] = binary.BigEndian.Uint32(pl[i+2:])
		}
	case http2.FrameGoAway:
		if len(pl) < 8 {
			p.fail("GOAWAY of %d bytes", len(pl))
			return
		}
		c.goaways = append(c.goaways, goaway{fromClient: p.fromClient,
			code: http2.ErrCode(binary.BigEndian.Uint32(pl[4:])), debug: string(pl[8:])})
	}
}

func (p *frameParser) endBlock(now time.Time) {
	fields, err := p.dec.DecodeFull(p.block)
	if err != nil {
		p.fail("stream %d: HPACK: %v", p.blockStream, err)
		return
	}
	s := p.c.stream(p.blockStream)
	if p.fromClient {
		for _, f := range fields {
			s.reqHeaderBytes += int(f.Size())
			if f.Name == ":path" {
				s.path = f.Value
			}
		}
		return
	}
	if s.respHeaders == nil {
		s.respHeaders = fields
		if !p.blockEnd {
			return
		}
	}
	// The last header block: trailers (or the only one, trailers-only).
	s.trailers = fields
	if p.blockEnd {
		s.serverEnd = now
	}
}

// --- what the tap saw ---------------------------------------------------

// connections is how many connections clients opened.
func (tp *tap) connections() int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return len(tp.conns)
}

// frames counts the frames of typ sent by the client (fromClient) or the
// daemon, on every connection.
func (tp *tap) frames(fromClient bool, typ http2.FrameType) int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	n := 0
	for _, c := range tp.conns {
		for _, f := range c.frames {
			if f.fromClient == fromClient && f.typ == typ {
				n++
			}
		}
	}
	return n
}

// maxFrame is the longest frame of typ the daemon (or the client) sent.
func (tp *tap) maxFrame(fromClient bool, typ http2.FrameType) int {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	n := 0
	for _, c := range tp.conns {
		for _, f := range c.frames {
			if f.fromClient == fromClient && f.typ == typ {
				n = max(n, f.length)
			}
		}
	}
	return n
}

// goaways are the GOAWAY frames the daemon (or the client) sent.
func (tp *tap) goaways(fromClient bool) []goaway {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	var out []goaway
	for _, c := range tp.conns {
		for _, g := range c.goaways {
			if g.fromClient == fromClient {
				out = append(out, g)
			}
		}
	}
	return out
}

// setting is a SETTINGS value the daemon sent on the first connection.
func (tp *tap) setting(id http2.SettingID) (uint32, bool) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if len(tp.conns) == 0 {
		return 0, false
	}
	v, ok := tp.conns[0].settings[id]
	return v, ok
}

// parseErrors is what the tap could not read; a test fails on any.
func (tp *tap) parseErrors() []error {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	var out []error
	for _, c := range tp.conns {
		out = append(out, c.errs...)
	}
	return out
}

// tapCall is a ShouldRateLimit stream as the daemon answered it.
type tapCall struct {
	stream      uint32
	headerBytes int
	ended       bool // the daemon ended the stream
	rst         *http2.ErrCode
	result      result // the gRPC status and decoded answer
	err         error  // the answer could not be read
}

// calls are the ShouldRateLimit streams of every connection, in stream order
// within a connection.
func (tp *tap) calls() []tapCall {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	var out []tapCall
	for _, c := range tp.conns {
		var ids []uint32
		for id, s := range c.streams {
			if s.path == rlsPath {
				ids = append(ids, id)
			}
		}
		slices.Sort(ids)
		for _, id := range ids {
			out = append(out, c.streams[id].call())
		}
	}
	return out
}

func (s *tapStream) call() tapCall {
	tc := tapCall{stream: s.id, headerBytes: s.reqHeaderBytes, ended: !s.serverEnd.IsZero(), rst: s.rstByServer}
	// Trailers, then RST_STREAM(NO_ERROR), is an answer: a server that
	// answers before the request's end says so (RFC 9113 8.1).
	if s.trailers == nil {
		tc.err = fmt.Errorf("stream %d: no trailers (reset by the daemon: %v)", s.id, s.rstByServer)
		return tc
	}
	if st := header(s.respHeaders, ":status"); st != "200" {
		tc.err = fmt.Errorf("stream %d: HTTP status %q", s.id, st)
		return tc
	}
	code, err := strconv.Atoi(header(s.trailers, "grpc-status"))
	if err != nil {
		tc.err = fmt.Errorf("stream %d: grpc-status %q", s.id, header(s.trailers, "grpc-status"))
		return tc
	}
	tc.result = result{Code: code, Details: header(s.trailers, "grpc-message")}
	if code == 0 {
		tc.result.Resp, tc.err = decodeAnswer(s.body)
	}
	return tc
}

func header(fs []hpack.HeaderField, name string) string {
	for _, f := range fs {
		if f.Name == name {
			return f.Value
		}
	}
	return ""
}

// waitFor polls cond (under the tap's lock) until it holds or timeout.
func (tp *tap) waitFor(timeout time.Duration, cond func() bool) bool {
	return testutil.Poll(timeout, func() error {
		tp.mu.Lock()
		defer tp.mu.Unlock()
		if !cond() {
			return errors.New("not yet")
		}
		return nil
	}) == nil
}
