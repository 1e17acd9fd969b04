// Package envoymodel is a model of the client side of Envoy's rate_limit_quota
// HTTP filter (RLQS): the bucket cache, the enforcement of the server's
// assignments, and the usage reports on the StreamRateLimitQuotas stream. The
// tests of the RLQS service and the load generator use it to stand in for
// Envoy.
//
// Its behaviour comes from Envoy's source, not from this project's server. The
// citations in comments use the tags of docs/research on issue 33 (paths in
// envoyproxy/envoy as mirrored at wbpcode/envoy@cb2a49b, 2026-07-22): GC is
// source/extensions/filters/http/rate_limit_quota/global_client_impl.cc, F is
// that directory's filter.cc, FP its filter_persistence.cc, TB is
// source/common/common/token_bucket_impl.cc, RLQS and CFG are the service and
// filter protos. Where Envoy's result is undefined (a NaN, a crash), the doc
// comment at that spot says what the model does instead.
//
// Why a package of its own: the model must stay independent of the server it
// tests, so that a misunderstanding of Envoy shared by both cannot pass
// unnoticed. It must never import the server, engine or descriptors packages,
// never adjust its behaviour to what this project's server sends, and never be
// used by the daemon itself.
package envoymodel
