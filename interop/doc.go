// Package interop drives the real sharelimit binary with HTTP/2 and gRPC
// clients that nobody in this project wrote: gRPC C-core (Debian's
// python3-grpcio), Node's @grpc/grpc-js, nghttp2's h2load and nghttp, and
// curl. Every scenario runs against both gRPC transports, --grpc-transport
// direct and grpc-go, with the same assertions.
//
// It exists because every other test of the direct transport (server/h2)
// speaks HTTP/2 through grpc-go's client, h2spec, or frames written here: a
// transport can pass all of those and still stall, or mis-answer, the first
// time a client with another HTTP/2 stack interleaves its frames differently,
// pings on its own schedule, or splits its headers otherwise. Envoy's own
// gRPC client is of the nghttp2 family; the clients here are those a new
// user would reach for.
//
// The client code is small and ours only where it must be: clients/rls.py
// and clients/rls.js encode RateLimitRequest and decode RateLimitResponse by
// hand, and the tests build request bodies with the go-control-plane types.
// Everything between them and the daemon (HTTP/2 framing, HPACK, flow
// control, keepalive, deadlines, cancellation, TLS) is the clients' own.
// A wire tap (tap_test.go), a TCP relay that only reads the frames it
// passes on, shows what went over the connection: how many connections,
// CONTINUATION and WINDOW_UPDATE frames, resets, GOAWAYs, and the answers a
// raw HTTP/2 client does not decode itself.
//
// The clients are installed by `make deps`; a missing one fails the test
// that needs it, never skips it.
package interop
