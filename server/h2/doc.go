// Package h2 serves the rate-limit call over HTTP/2 itself, and hands every
// other gRPC call to a grpc-go server. It exists because after the decision
// and the codec were made cheap, grpc-go's transport was nearly all that was
// left of a decision's cost: a goroutine hand-off, a writer goroutine and
// about fifty allocations per call, and a socket write per answer.
//
// Here each connection is one goroutine. It reads frames in batches from a
// buffered reader, decides each ShouldRateLimit call as soon as its request
// is complete, writes the answer's frames into the connection's buffer, and
// writes that buffer to the socket once the bytes already read are used up:
// one read and one write for as many calls as arrived together. A call that
// must wait (a rule with policy: wait) is answered from a timer instead.
//
// Any other call (health, reflection) is relayed to an in-process grpc-go
// server, message by message, so those services keep grpc-go's own
// implementation; their request metadata is not relayed. The frames are read
// by golang.org/x/net/http2's Framer, which checks frame sizes and order and
// decodes HPACK.
//
// It must never block a connection's goroutine on anything but its socket: a
// call that must wait is answered from a timer, and a relayed call runs on
// goroutines of its own. It must never decide a request itself (the Answerer
// does) nor start anything when built: New starts nothing, and the first
// Serve starts the grpc-go server relayed calls go to.
package h2
