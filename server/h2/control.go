package h2

// Frames about the connection rather than one call: SETTINGS,
// WINDOW_UPDATE, PING (keepalive and its enforcement), and GOAWAY for a
// graceful stop.

import (
	"time"

	"golang.org/x/net/http2"
)

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

// errTooManyPings ends a connection that pings too often. gRPC clients
// (grpc-go, C-core, grpc-js) back their keepalive off only when the GOAWAY's
// debug data is exactly "too_many_pings"; on anything else they reconnect
// at the same rate and are cut again, forever.
var errTooManyPings = goAwayError{http2.ErrCodeEnhanceYourCalm, "too_many_pings"}

// goAwayError ends a connection with a GOAWAY carrying its own debug data.
type goAwayError struct {
	code  http2.ErrCode
	debug string
}

func (e goAwayError) Error() string { return "h2: " + e.code.String() + ": " + e.debug }

// ping answers a PING; the acknowledgement of a graceful stop's own PING sends
// its final GOAWAY.
func (c *conn) ping(f *http2.PingFrame) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if !f.IsAck() {
		now := time.Now()
		if !c.lastPing.IsZero() && now.Sub(c.lastPing) < pingInterval {
			if c.pingStrikes++; c.pingStrikes > maxPingStrikes {
				return errTooManyPings
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
