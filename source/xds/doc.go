// Package xds is the rules source fed by an xDS management server, as
// upstream's CONFIG_TYPE=GRPC_XDS_SOTW: instead of reading YAML files, the
// daemon subscribes over ADS (state of the world) to resources of type
// ratelimit.config.ratelimit.v3.RateLimitConfig, one per domain, and installs
// every update the server pushes.
//
// It exists so that operators who already drive upstream from a control plane
// can switch without changing that control plane. It keeps sharelimit's one
// rule about config: whatever the source, a set is compiled by
// descriptors.Compile, so an update passes exactly the validation a file does.
// Each resource is rendered as the YAML document it stands for (ToFile), named
// "xds:<resource name>", and the documents of one update are compiled together.
// The positions in an error (xds:name:line:col) point into that rendering.
//
// Like package source, it must never touch buckets, metrics or the engine:
// it hands finished sets to Apply. It must never ACK a set that did not
// compile or that Apply refused, nor drop the rules in force for want of a
// server.
//
// # Protocol
//
// Every response carries the full set. A set that compiles and that Apply
// accepts is ACKed with its version; anything else is NACKed with the error
// text as error_detail and the version last ACKed, and the rules in force stay.
// An update with no resources is a valid, empty set: every request is then
// allowed, as upstream does. While the server is unreachable the rules in force
// stand; the source reconnects with exponential back-off and jitter, and on a
// new stream sends the version it last ACKed, as Envoy does.
//
// The source speaks ADS directly with go-control-plane's discovery types
// rather than through go-control-plane's own SotW client
// (pkg/client/sotw/v3). That client hides the version_info and type_url of
// the responses it returns, so the version ACKed or NACKed could not be
// reported in Status, nor a response of a foreign type be told apart; and on
// reconnect its InitConnect ACKs the last response received, even one it had
// NACKed.
//
// go-control-plane's snapshot cache answers a NACK by sending the same
// response again at once (go-control-plane issues #46 and #962), which with a
// naive client is a NACK loop as fast as the network allows. The source
// answers a response identical to one it just NACKed on the same stream only
// after a pause that grows as the reconnect back-off does; a new version
// arriving on the stream is handled at once. An identical response is not
// compiled again, nor counted again in Status.Nacks.
//
// # Mapping
//
// RateLimitConfig: name gives the file name; domain and descriptors map to
// the YAML fields of the same names. RateLimitDescriptor: key, value,
// rate_limit, descriptors, shadow_mode, detailed_metric, quota_mode and
// metadata (a google.protobuf.Struct, rendered as the YAML map it holds).
// RateLimitPolicy: unit, requests_per_unit, unlimited, name and
// replaces[{name}].
//
// Units are mapped by number, and the numbers are those of sharelimit's
// units: SECOND, MINUTE, HOUR, DAY, WEEK (7), MONTH (5) and YEAR (6) become
// second ... year. UNKNOWN, or a number no unit has, is rendered as written
// (UNKNOWN, or the number) and refused as a bad unit in a file is ("invalid
// rate limit unit 'UNKNOWN'"), except with unlimited, where a unit is ignored
// as upstream ignores an invalid one. proto3 has no presence for scalars, so
// requests_per_unit is always rendered when the limit is not unlimited: 0
// means "block", as upstream reads it.
//
// The generated Go types this build uses
// (github.com/envoyproxy/go-control-plane/ratelimit v0.1.0) predate
// quota_mode (field 7 of RateLimitDescriptor), metadata (field 8) and the
// units WEEK, MONTH and YEAR, all of which upstream's proto has. The two
// fields are read from the message's unknown fields when the types lack them
// (and through protobuf reflection once they have them), and the units by
// number, so a management server built against upstream's proto is understood
// in full. Any other field this build does not know is refused, as an unknown
// key in a file is: ignoring it could silently change what a rule means.
//
// # What the proto lacks
//
// The YAML has fields RateLimitConfig cannot carry. Rules from xDS cannot use
// them, and get their defaults:
//
//   - in a descriptor: value_to_metric and share_threshold (upstream's YAML
//     has them, its proto does not);
//   - in rate_limit, sharelimit's extensions: unit_multiplier (so the window
//     is one unit), burst (one window's worth), policy (reject) and max_wait.
//
// YAML's own devices (anchors, merge keys) have no meaning here.
package xds
