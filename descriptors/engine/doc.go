// Package engine decides rate-limit requests against the installed
// descriptors.Set: it matches each descriptor, plans its bucket request
// once, draws it from the store of package bucket, and accounts the answer
// as upstream envoyproxy/ratelimit does. It holds the runtime around that:
// the weight groups that divide limits among replicas, the bucket keys and
// their seed, snapshots of the buckets, a ramp for rules a reload adds, and
// the hooks demand sharing meters and steers (DemandRule, HotValue), and
// those RLQS divides a bucket's share by (BucketShare, Lease).
//
// It is its own package so that the rules package stays pure, and so that
// what serves requests has one owner with its options fixed when it is
// built (New). It is handed the time; it must never read a clock, the
// environment or a file, keep a package variable, start a goroutine or
// export a metric. The daemon swaps whole compiled Sets into it on reload,
// and it keeps bucket state across swaps for every rule that did not change.
package engine
