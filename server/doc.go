// Package server adapts the engine to the network: Envoy's RateLimitService v3
// over gRPC (with health and reflection), and the admin HTTP listener. It owns
// no rules and no buckets; it maps requests in, decisions out, and the engine's
// errors to gRPC codes.
//
// It is its own package so that the rules and buckets stay free of gRPC, HTTP
// and Prometheus. It must never decide a request or touch a bucket except
// through the engine, and its metrics count and return nothing: answers are
// built from the installed set, never from what the metrics hold.
package server
