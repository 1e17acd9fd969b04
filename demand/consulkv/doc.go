// Package consulkv keeps demand reports and the leader's share parameters in
// Consul KV, off the request path.
//
// Why a leader: if every replica watched every other's report, Consul would
// serve each report to every replica, O(N²) bytes per round (100 MB/s at
// 1,000 replicas writing once a second), and Consul streams only the health
// endpoint, not KV. Instead one replica, holding a session lock, reads the
// reports and publishes one small key per service; everyone else watches that
// one key, O(N) served bytes per change.
//
// Why sessions: each report is written with a session lock on its own key.
// The session has a TTL and no checks (the e2e topology, and many real ones,
// register external nodes that have no serf health check), and behaviour
// "delete", so a dead replica's report disappears by itself once its session
// expires, and the leader lock passes on the same way. A replica restarted
// before its previous process's session expired finds its key locked by that
// session, which bears its own name ("sharelimit demand <service> <node>"):
// it ends that session, once, and writes its own report at once, rather than
// being refused for up to twice the TTL (Publisher).
//
// Keys, under a prefix such as sharelimit/demand/, per service:
//
//	<prefix><service>/reports/<node>   one report per replica
//	<prefix><service>/leader           the leader lock
//	<prefix><service>/params           the leader's parameters
//
// Why a package of its own: it is the only code that speaks Consul KV, so
// sessions, locks, blocking reads and their faults are tested here against a
// real agent, once. It moves bytes: the encoding is package demand's and
// the division is a function the caller hands the Leader, so it never
// decodes a report or decides a share itself. It must never write a
// service's parameters without holding the leader lock (every write is a
// transaction that checks it), and never be on the request path.
package consulkv

import (
	"errors"
	"math/rand/v2"
	"time"
)

// Keys names a service's keys under a prefix.
type Keys struct{ Prefix, Service string }

// Report is node's report key.
func (k Keys) Report(node string) string { return k.Reports() + node }

// Reports is the folder of the reports, with its trailing slash.
func (k Keys) Reports() string { return k.Prefix + k.Service + "/reports/" }

// Leader is the leader lock's key.
func (k Keys) Leader() string { return k.Prefix + k.Service + "/leader" }

// Params is the parameters' key.
func (k Keys) Params() string { return k.Prefix + k.Service + "/params" }

// ErrNoSession is returned by a write that needs the session before it
// exists (or while it is being replaced).
var ErrNoSession = errors.New("consulkv: no session")

// backoff is the wait after the n-th consecutive error: from 250 ms,
// doubling, at most 10 s, with ±50% jitter.
func backoff(n int) time.Duration {
	d := 250 * time.Millisecond << min(n, 6)
	d = min(d, 10*time.Second)
	return time.Duration(float64(d) * (0.5 + rand.Float64()))
}

// sleep waits d or until done is closed; it reports whether d passed.
func sleep(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-t.C:
		return true
	}
}
