// Package controller runs demand sharing for one service: it closes the loop
// from the engine's meters to the engine's weights. Every replica measures
// its demand rules' offered and admitted rates, reports them to Consul when
// they move (or as a heartbeat), and sets each rule's weight group, and each
// hot value's, to its share under the leader's parameters: a smaller share at
// once, a larger one only after the grow delay, by when every replica has the
// parameters that shrink the others. The replica that holds the service's
// leader lock also divides: it reads every report, picks a per-value rule's
// hot values, and publishes the parameters. The controller shows what it
// does on /metrics and the admin pages (Status).
//
// Why "controller": it is the feedback loop, the one part of demand sharing
// that has state and timing. Package demand is its arithmetic and wire
// format, pure and shared with the simulator; package demand/consulkv is its
// store. Keeping the policy here, apart from the daemon, lets it be tested on
// a fake clock, with a fake engine and a fake store that loses writes,
// expires sessions and serves stale reports on demand, with no daemon and no
// Consul: the daemon only builds a Controller per Consul service and runs it.
//
// It reaches the engine through Engine alone (meters out, weights in) and
// Consul through demand/consulkv alone. It must never take a share looser
// than the parameters give it: every fault (stale or foreign parameters, a
// report the division did not count, a session that may expire, a node the
// catalog does not count) falls back to at most the equal share. It never
// touches buckets or the rules, and never blocks a decision: the engine's
// meters are atomic counters, read on the controller's own tick.
package controller
