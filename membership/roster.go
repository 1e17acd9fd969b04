package membership

import (
	"fmt"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
)

// The roster decides which instances a replica counts. Counting only the
// instances that pass their checks at this moment broke the one invariant
// that matters, that the weights in force over all replicas that serve sum
// to at most 1: an instance that serves while its check fails (a newcomer
// before its first pass, a check that flaps slower than the hold, a node
// whose registration a restarted Consul lost) was counted by nobody but
// itself, and took a share its peers had not left it.
//
// So an instance counts from the moment it is first seen registered,
// passing or not, until grace after it was last seen passing (or first
// seen, if it never passed), and that holds whether it is still listed or
// has vanished from the catalog. Every replica watches the same catalog and
// applies the same rule, so they count the same instances, and a replica
// that serves keeps the place its peers keep for it. The cost is in
// under-admission: an instance that has really died holds its share for
// grace before its peers take it over.
//
// A catalog that has lost most of the instances it counted at once (a
// Consul restarted empty, whose agents re-register over a minute or so) is
// suspect, as Envoy's panic threshold treats a cluster mostly unhealthy:
// while fewer than half of the instances remembered are listed passing,
// they count for panicGraces graces rather than one. A real scale-down by
// more than half at once is so believed only after that long, meanwhile
// the replicas that stay enforce the smaller shares of before (tighter).
//
// A roster is used by one goroutine (the watch); its zero value is empty and
// counts with a grace of 0, as the old rule did.
type roster struct {
	grace   time.Duration
	members map[string]*member
	// held is the grace the last answer applied: grace, or panicGraces
	// graces while the catalog was suspect.
	held time.Duration
}

// panicGraces is how many graces an instance counts while the catalog is
// suspect (see roster).
const panicGraces = 10

// member is one instance the roster has seen.
type member struct {
	node   string
	weight int
	// good is when the instance was last seen passing, or first seen if it
	// never was: it counts until good + grace.
	good time.Time
	// passing: listed passing in the last answer; such an instance counts
	// whatever the grace.
	passing bool
}

// counts reports whether m counts at now: listed passing, or seen passing
// (or first seen) less than grace ago.
func (m *member) counts(now time.Time, grace time.Duration) bool {
	return m.passing || now.Sub(m.good) < grace
}

// nextExpiry is how long from now until the next member that counts only
// by its grace stops counting; 0 when none does. The watch blocks no longer
// than that, so an expiry is seen when it falls due, not at the next change
// of the catalog.
func (r *roster) nextExpiry(now time.Time) time.Duration {
	var next time.Duration
	for _, m := range r.members {
		if m.passing {
			continue
		}
		if d := m.good.Add(r.held).Sub(now); d > 0 && (next == 0 || d < next) {
			next = d
		}
	}
	return next
}

// rosterKey names an instance: its node and service ID.
func rosterKey(e *api.ServiceEntry) (key, node string) {
	if e.Node != nil {
		node = e.Node.Node
	}
	id := ""
	if e.Service != nil {
		id = e.Service.ID
	}
	return strings.ToLower(node) + "\x00" + id, node
}

// observe takes one answer's entries at now and returns the instances it
// counts, cluster-wide and on node. weigh gives an entry's weight (at least
// 1); nil weighs every entry 1. With a grace of 0 it counts the entries
// listed passing, and only those, checked here again so that a proxy or
// filter that lets a failing instance through cannot inflate the count.
// Node names compare case-insensitively, as Consul's catalog does.
func (r *roster) observe(entries []*api.ServiceEntry, node string, now time.Time, weigh func(*api.ServiceEntry) int) (t tally) {
	if r.members == nil {
		r.members = make(map[string]*member)
	}
	seen := make(map[string]struct{}, len(entries))
	passing := 0
	for _, e := range entries {
		if e == nil {
			continue
		}
		key, n := rosterKey(e)
		if e.Service == nil || e.Service.ID == "" {
			// Consul always names an instance; an answer that does not
			// (a proxy's, a hand-made one) cannot be remembered across
			// answers, so it counts only while listed.
			key = fmt.Sprintf("%s\x00#%d", key, len(seen))
		}
		seen[key] = struct{}{}
		w := 1
		if weigh != nil {
			w = max(weigh(e), 1)
		}
		m := r.members[key]
		if m == nil {
			m = &member{good: now}
			r.members[key] = m
		}
		m.node, m.weight = n, w
		was := m.passing
		m.passing = e.Checks.AggregatedStatus() == api.HealthPassing
		if m.passing || was {
			// Passing now, or until now: a blocking query answers only
			// when something changed, so a member listed passing in the
			// last answer passed until this one.
			m.good = now
		}
		if m.passing {
			passing++
		}
	}
	for key, m := range r.members {
		if _, listed := seen[key]; !listed {
			if m.passing {
				m.good = now // it passed until this answer
			}
			m.passing = false
			if strings.Contains(key, "\x00#") {
				delete(r.members, key)
			}
		}
	}
	// A catalog listing fewer than half of the instances remembered as
	// passing is suspect: they keep counting, for up to panicGraces graces.
	grace := r.grace
	if 2*passing < len(r.members) {
		grace *= panicGraces
	}
	r.held = grace
	for key, m := range r.members {
		if !m.counts(now, grace) {
			delete(r.members, key)
			continue
		}
		t.total++
		t.totalWeight = addWeight(t.totalWeight, m.weight)
		if node != "" && strings.EqualFold(m.node, node) {
			t.local++
			t.localWeight = addWeight(t.localWeight, m.weight)
		}
	}
	return t
}
