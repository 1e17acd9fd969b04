// Package membership tells each replica what share of a global limit is its own.
//
// sharelimit divides every global limit among the replicas that enforce it, so
// each replica needs a live answer to "how many of us are there, and how many of
// those run on this node?". That answer must never be fetched on the request
// path: this package keeps it current in the background and publishes it as a
// View that the engine reads without a lock or a network call.
//
// Three sources exist. Static is the embedded default: a fixed replica count
// (--replicas), so the daemon runs with no Consul at all. Consul watches the
// service's passing instances in Consul's health catalog with blocking queries
// and republishes the view whenever the catalog changes. Where instances
// carry Consul service weights, the share is weight-proportional. The watch
// asks for the agent's cache, so one agent serves many watches from one
// subscription to the servers, and falls back to plain queries where the
// agent cannot. DNS counts the addresses a name resolves to (a Kubernetes
// headless Service, Consul's DNS, a compose service), resolving it again
// every interval.
//
// A Damper sits between a source and the engine: a view that shrinks the
// share applies at once, one that grows it only once it has held, so a
// flapping check never opens the cap. The package only publishes views; it
// never touches token buckets.
//
// Why a package of its own: what each source makes of its catalog or name, and
// the damper's timing, are tested here with no engine: the sources against a
// real Consul agent (its catalog and its DNS interface), the damper on a fake
// clock. It must never be on the request path, and never make a share looser
// on bad input: an impossible count, an answer filtered by ACLs or refused, or
// one with no passing instance is a fault, and the last view stands.
package membership

import (
	"errors"
	"fmt"
	"time"
)

// View is one observation of the replica set. Views are values: a published
// View is never modified, so it may be kept and compared freely.
type View struct {
	Source string // "static", "consul" or "dns"
	// Node is the Consul node whose instances count as local; "" for a static
	// view and until the node name is known.
	Node string
	// Name is the DNS name whose addresses are counted (--peers-dns); ""
	// for the other sources.
	Name  string
	Total int // passing instances of the service, cluster-wide
	Local int // passing instances on this node
	// TotalWeight and LocalWeight are the summed Consul service weights
	// (Weights.Passing) of the instances Total and Local count. Every
	// instance weighs at least 1; with weights off, and in a static or
	// --replicas view, each weighs exactly 1, so they equal Total and Local.
	TotalWeight int
	LocalWeight int
	// Weight is this replica's share of every global limit, in (0, 1]:
	// Weight(LocalWeight, TotalWeight).
	Weight float64
	// ObservedAt is when the source last confirmed this view. It is zero for a
	// static view and for the --replicas view that stands until Consul first
	// answers, so "never confirmed" can be told apart from "confirmed long ago".
	ObservedAt time.Time
	// LastError is the most recent watch error since the last success, "" if
	// none. It never contains the configured ACL token.
	LastError string
	Errors    uint64 // watch errors since start
	// Fault names what keeps this view from being the cluster's, "" when
	// nothing does: one of the Fault* causes.
	Fault string
}

// The faults a view can carry. Each is logged at WARN when it begins,
// exported as sharelimit_membership_fault{cause} and shown on the status
// page: a config or permissions mistake must never look like a healthy
// cluster.
const (
	// FaultACLFiltered: Consul filtered the answer by ACLs; the last view
	// stands.
	FaultACLFiltered = "acl_filtered"
	// FaultForbidden: Consul refused the query (403); the last view stands.
	FaultForbidden = "forbidden"
	// FaultNonePassing: the answer listed no passing instance, or (DNS)
	// no address; the last view stands.
	FaultNonePassing = "none_passing"
	// FaultSuspect: a replica that just started got an answer listing fewer
	// instances than its view expects (--replicas, or a saved view); the
	// view stands, for up to ten graces.
	FaultSuspect = "suspect"
	// FaultAbsent: this replica's node has no counted instance (DNS: an
	// answer listed one of this host's addresses, and none counts any
	// more); its peers leave it no room, so it takes AbsentWeight.
	FaultAbsent = "absent"
	// FaultError: any other failed query; the last view stands.
	FaultError = "error"
	// FaultUnshared: a view of one replica where the deployment is
	// envoyproxy/ratelimit's, whose replicas shared one count in Redis: if
	// there are more replicas, each enforces every limit whole. The daemon
	// sets it on a static view of one (it knows the deployment), and the
	// DNS source on an answer of one address that is not this host's (a
	// ClusterIP Service's, a load balancer's); the view stands as
	// configured, or as answered.
	FaultUnshared = "unshared"
)

// AbsentWeight is the weight of a replica whose node has no counted
// instance. It is not 0, so that every figure divided by a weight stays
// finite, and it is so small that such a replica's buckets hold only the
// one-token floor every bucket has, refilled at a billionth of the rate.
const AbsentWeight = 1e-9

// ErrImpossibleCount marks instance counts that no catalog can hold, such as
// more instances on one node than in the whole service.
var ErrImpossibleCount = errors.New("impossible instance count")

// Weight is the share of a global limit that one replica enforces, given the
// instances counted on its node (local) and in the whole cluster (total):
//
//	w = local / total, or AbsentWeight when local is 0
//
// With one instance per node this is 1/N. The same rule divides by Consul
// service weights: given the summed weights of the counted instances on this
// node (local) and in the cluster (total), w is this node's part of the total.
//
// A replica whose node has no counted instance is counted by none of its
// peers either (they watch the same catalog, by the same rule): the shares
// they enforce already sum to 1, and any share it took would open the cap
// by that much. It takes AbsentWeight. (The rule this replaced counted such
// a replica in at weight 1 over total+1, which its peers never did: a
// newcomer serving before its check passed, or a node a restarted Consul had
// not yet re-listed, admitted up to twice the limit between them.)
//
// A count that makes no sense (negative, local above total, or no instance at
// all) is an error wrapping ErrImpossibleCount, with weight 0. It never gets
// a share: every share such a count could get is a guess, and the natural
// guess, 1, lets every replica enforce each limit whole, N times the cap.
// The caller keeps the view it had.
func Weight(local, total int) (float64, error) {
	var why string
	switch {
	case local < 0 || total < 0:
		why = "negative"
	case local > total:
		why = "more on this node than in total"
	case total == 0:
		why = "no instance at all"
	case local == 0:
		return AbsentWeight, nil
	default:
		return float64(local) / float64(total), nil
	}
	return 0, fmt.Errorf("weigh %d local of %d instances: %s: %w", local, total, why, ErrImpossibleCount)
}

// Static is the membership source used without Consul: a fixed replica count,
// each replica enforcing 1/N of every limit. It is safe for concurrent use and
// never changes after construction.
type Static struct {
	view View
}

// NewStatic returns a static source for the given replica count; a count
// below 1 means 1 (the replica is alone). The daemon never passes one: its
// config refuses --replicas below 1. A static view has a zero ObservedAt:
// nothing ever confirms it, so it has no age.
func NewStatic(replicas int) *Static {
	return &Static{view: replicasView("static", replicas)}
}

// replicasView is the view of a fixed replica count, one per node, as
// --replicas states it.
func replicasView(source string, replicas int) View {
	replicas = max(replicas, 1)
	// One instance of replicas >= 1 is a possible count, so this is 1/replicas.
	w, _ := Weight(1, replicas)
	return View{Source: source, Total: replicas, Local: 1, TotalWeight: replicas, LocalWeight: 1, Weight: w}
}

// View returns the static view.
func (s *Static) View() View { return s.view }
