// Package wire encodes and decodes Envoy's RateLimitService messages by hand,
// and is the daemon's gRPC codec. It exists because the generic protobuf
// runtime is most of what a decision costs beyond the transport: it decodes a
// request into one allocation per descriptor, entry and string, and marshals an
// answer into a fresh slice sized by a separate pass over the message.
//
// Here a request is decoded into a fixed handful of allocations whatever its
// shape (a short one into a single block holding its bytes, which its strings
// point into; a longer one with its strings copied out together), and an
// answer is written into a pooled buffer that grpc-go hands back once it is on
// the wire. The bytes are the protobuf runtime's own: fuzz tests hold the
// decoder to proto.Unmarshal and the encoder to proto.Marshal. Any other
// message, and any answer carrying fields this package does not write (dynamic
// metadata, quota, a raw body), goes to grpc-go's protobuf codec unchanged.
//
// It must never write bytes other than proto.Marshal's, nor decode a request
// to anything but what proto.Unmarshal makes of it: a message it cannot write
// exactly is handed to the runtime.
//
// An answer is written as vtprotobuf writes one, back to front into bytes
// sized by one pass, and about as fast (docs/BENCHMARKS.md, "The answer
// encoder against vtprotobuf"); the vtprotobuf code go-control-plane ships
// for these messages is compiled only with the vtprotobuf build tag, so it is
// not used.
package wire
