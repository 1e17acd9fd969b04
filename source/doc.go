// Package source is where rule sets come from. A source turns what it reads
// into a validated *descriptors.Set through descriptors.Compile and hands it to
// an apply function, which may refuse it. This package is the file source:
// Load and LoadWith read a directory or files once, and Watcher reloads a
// directory that changes. Package source/xds is the other source, an xDS
// management server's.
//
// Why a package: reading rules is I/O (directory walks, upstream's file
// naming, merging domains, debouncing changes) and package descriptors is
// pure; keeping the I/O here lets the daemon, check and explain read a
// directory exactly alike.
//
// It must never touch buckets, metrics or the engine: it hands over finished
// sets, and an error from apply is how a bad update is refused.
package source
