// Package envoymodel is a model of the client side of Envoy's rate_limit_quota
// HTTP filter (RLQS): the bucket cache, the enforcement of the server's
// assignments, and the usage reports on the StreamRateLimitQuotas stream. The
// tests of the RLQS service and the load generator use it to stand in for
// Envoy.
//
// Its behaviour comes from Envoy's source, not from this project's server.
// Citations are file:line in envoyproxy/envoy as of 2026-07-22 (1.40.0-dev,
// read at its mirror wbpcode/envoy@cb2a49b09ea4), with these short names, R
// being source/extensions/filters/http/rate_limit_quota: GC is
// R/global_client_impl.cc, F is R/filter.cc, FP is R/filter_persistence.cc,
// TB is source/common/common/token_bucket_impl.cc, IT is
// test/extensions/filters/http/rate_limit_quota/integration_test.cc. Where
// Envoy's result is undefined (a NaN, a crash), the comment at that spot says
// what the model does instead.
//
// Why a package of its own: the model must stay independent of the server it
// tests, so that a misunderstanding of Envoy shared by both cannot pass
// unnoticed. It must never import the server, engine or descriptors packages,
// never adjust its behaviour to what this project's server sends, and never be
// used by the daemon itself.
package envoymodel
