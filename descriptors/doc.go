// Package descriptors is sharelimit's rules. It turns upstream
// envoyproxy/ratelimit's descriptor YAML (plus sharelimit's extensions) into
// an immutable, compiled match tree, a Set, matches a request's entries
// against it, and explains a match. Package engine, below it, decides
// requests against a Set with the token buckets of package bucket.
//
// It is its own package so that what a config means can be read, checked and
// explained (sharelimit check, explain) without any runtime state. It is
// pure: it is handed bytes, and reads no file, no clock and no environment;
// it keeps no globals, no buckets and no atomics of runtime state, and
// exports no metrics. Sources of config (files, xDS) live elsewhere and hand
// it bytes.
package descriptors
