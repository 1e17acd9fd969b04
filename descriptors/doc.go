// Package descriptors is sharelimit's rule engine. It turns upstream
// envoyproxy/ratelimit's descriptor YAML (plus sharelimit's extensions) into an
// immutable, compiled match tree, a Set, and decides requests against the
// installed Set with the token buckets of package bucket.
//
// The package is pure: it is handed bytes and the time, and reads no file, no
// clock and no environment; it keeps no globals and exports no metrics.
// Sources of config (files, xDS) live elsewhere and hand it bytes. The daemon
// swaps whole compiled Sets on reload; an Engine keeps bucket state across
// swaps for every rule that did not change.
package descriptors
