// Package rlqs serves Envoy's Rate Limit Quota Service (RLQS,
// envoy.service.rate_limit_quota.v3): Envoy streams usage reports for its
// buckets, and this package answers with token-bucket assignments that Envoy
// enforces in its own process, so a request costs no call.
//
// Each bucket id resolves, through the engine, to the same rule and bucket key
// an RLS request with those values would use. This replica's share of that
// bucket (w·R, w·B) is divided with demand.Apportion among the streams that
// report it and, through an engine lease, the local RLS bucket on the same
// key, so that RLS and every RLQS assignment together never exceed the share.
// A divider (Run) re-divides when reports, shares or streams change: a shrink
// is pushed at once, a grow waits for the hold, and a stream that ended counts
// until its last assignment's time to live has passed.
//
// It is its own package because it holds per-stream state and a goroutine of
// its own, unlike the RLS adapter in server, and because its only contract with
// the engine is the small Engine interface below. It must never hand out more
// than the share (rounding is always down, an unknown id is denied, never
// allowed by accident), never let a slow client block the divider or another
// stream, and never keep state that grows with what clients send: bucket ids
// are capped in number (--max-buckets) and in size (MaxIDBytes), what a
// report adds to the meters is bounded, queues are bounded and idle buckets
// abandoned.
package rlqs
