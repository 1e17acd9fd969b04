package h2

import (
	"encoding/binary"
	"strconv"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
)

// Frames are written by hand into the connection's output buffer: a frame
// header is nine bytes, and the header blocks this server sends are a few
// fixed fields. Every field is a literal that is never indexed, so no HPACK
// encoder state is kept and the blocks for an answer are constant bytes.

const frameHeaderLen = 9

// appendFrameHeader appends a frame header for a payload of n bytes.
func appendFrameHeader(b []byte, n int, t http2.FrameType, flags http2.Flags, stream uint32) []byte {
	return append(b, byte(n>>16), byte(n>>8), byte(n), byte(t), byte(flags),
		byte(stream>>24)&0x7f, byte(stream>>16), byte(stream>>8), byte(stream))
}

// putFrameLength writes n into the length of the frame header at b.
func putFrameLength(b []byte, n int) {
	b[0], b[1], b[2] = byte(n>>16), byte(n>>8), byte(n)
}

// appendHpackInt appends v as an HPACK integer with an n-bit prefix, the
// first byte's high bits set to first (RFC 7541, 5.1).
func appendHpackInt(b []byte, first byte, n uint, v uint64) []byte {
	limit := uint64(1)<<n - 1
	if v < limit {
		return append(b, first|byte(v))
	}
	b = append(b, first|byte(limit))
	v -= limit
	for v >= 128 {
		b = append(b, byte(v&0x7f)|0x80)
		v >>= 7
	}
	return append(b, byte(v))
}

// appendHpackString appends s as a raw (not Huffman-coded) HPACK string.
func appendHpackString(b []byte, s string) []byte {
	b = appendHpackInt(b, 0, 7, uint64(len(s)))
	return append(b, s...)
}

// appendNeverIndexed appends the field name: value as a literal never indexed,
// with a literal name (RFC 7541, 6.2.3).
func appendNeverIndexed(b []byte, name, value string) []byte {
	b = append(b, 0x10)
	b = appendHpackString(b, name)
	return appendHpackString(b, value)
}

// hpackTableSizeZero is a dynamic table size update to 0 (RFC 7541, 6.3),
// sent first in the next header block after a client changes its
// SETTINGS_HEADER_TABLE_SIZE: this server's blocks never use the table.
const hpackTableSizeZero = 0x20

// responseHeaders is the header block of every answer: ":status: 200" is
// entry 8 of the static table.
var responseHeaders = appendNeverIndexed([]byte{0x88}, "content-type", "application/grpc")

// trailersOK is the trailer block of a call that succeeded.
var trailersOK = appendNeverIndexed(nil, "grpc-status", "0")

// appendStatusFields appends grpc-status and, when msg is not empty,
// grpc-message, percent-encoded as gRPC's HTTP/2 mapping says.
func appendStatusFields(b []byte, code codes.Code, msg string) []byte {
	b = appendNeverIndexed(b, "grpc-status", strconv.Itoa(int(code)))
	if msg != "" {
		b = appendNeverIndexed(b, "grpc-message", percentEncode(msg))
	}
	return b
}

// percentEncode encodes the bytes gRPC requires encoded in grpc-message:
// anything outside printable ASCII, and '%'.
func percentEncode(s string) string {
	plain := true
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '%' {
			plain = false
			break
		}
	}
	if plain {
		return s
	}
	const hex = "0123456789ABCDEF"
	out := make([]byte, 0, len(s)+16)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c > 0x7e || c == '%' {
			out = append(out, '%', hex[c>>4], hex[c&0xf])
			continue
		}
		out = append(out, c)
	}
	return string(out)
}

// appendWindowUpdate appends a WINDOW_UPDATE of n bytes.
func appendWindowUpdate(b []byte, stream uint32, n uint32) []byte {
	b = appendFrameHeader(b, 4, http2.FrameWindowUpdate, 0, stream)
	return binary.BigEndian.AppendUint32(b, n&0x7fffffff)
}

// appendRSTStream appends a RST_STREAM with code.
func appendRSTStream(b []byte, stream uint32, code http2.ErrCode) []byte {
	b = appendFrameHeader(b, 4, http2.FrameRSTStream, 0, stream)
	return binary.BigEndian.AppendUint32(b, uint32(code))
}

// appendGoAway appends a GOAWAY naming last as the last stream processed.
func appendGoAway(b []byte, last uint32, code http2.ErrCode, debug string) []byte {
	b = appendFrameHeader(b, 8+len(debug), http2.FrameGoAway, 0, 0)
	b = binary.BigEndian.AppendUint32(b, last&0x7fffffff)
	b = binary.BigEndian.AppendUint32(b, uint32(code))
	return append(b, debug...)
}

// appendPing appends a PING with data, acknowledging one when ack is set.
func appendPing(b []byte, data [8]byte, ack bool) []byte {
	var flags http2.Flags
	if ack {
		flags = http2.FlagPingAck
	}
	b = appendFrameHeader(b, 8, http2.FramePing, flags, 0)
	return append(b, data[:]...)
}

// appendSettings appends a SETTINGS frame holding s.
func appendSettings(b []byte, s ...http2.Setting) []byte {
	b = appendFrameHeader(b, 6*len(s), http2.FrameSettings, 0, 0)
	for _, x := range s {
		b = binary.BigEndian.AppendUint16(b, uint16(x.ID))
		b = binary.BigEndian.AppendUint32(b, x.Val)
	}
	return b
}

// appendSettingsAck appends the acknowledgement of the peer's SETTINGS.
func appendSettingsAck(b []byte) []byte {
	return appendFrameHeader(b, 0, http2.FrameSettings, http2.FlagSettingsAck, 0)
}
