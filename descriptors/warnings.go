package descriptors

import (
	"fmt"
	"math"
	"time"
)

// demandFloor is package demand's DefaultFloor: the least share a replica
// keeps, as a part of its equal share. (descriptors does not import demand.)
const demandFloor = 0.1

// EnvoyDefaultTimeout is the rate-limit filter's default timeout: a max_wait
// not under it means Envoy gives up before the answer comes.
const EnvoyDefaultTimeout = 20 * time.Millisecond

// Warnings are the things in s that are valid but probably not what the author
// meant, with replicas sharing each limit; they never fail a check.
func (s *Set) Warnings(replicas int) []string {
	var out []string
	w := 1 / float64(replicas)
	for _, r := range s.rules {
		l := r.limit
		if l == nil || l.unlimited {
			continue
		}
		if !l.params.Blocked() && l.share == ShareCluster && l.params.Size*w < 1 {
			out = append(out, fmt.Sprintf("%s: %s: warning: a burst of %d over %d replicas is %.3g per replica; each replica still admits 1, so the cluster may admit up to %d per window",
				r.pos, r.path, l.burst, replicas, l.params.Size*w, replicas))
		}
		if !l.params.Blocked() && l.share == ShareDemand && l.params.Size*w*demandFloor < 1 {
			out = append(out, fmt.Sprintf("%s: %s: warning: share: demand with a burst of %d over %d replicas: a replica at the floor of its share (%.0f%% of its equal share) would hold %.3g tokens; each holds at least 1, so the cluster may admit more than the limit for a while; raise the burst to at least %d",
				r.pos, r.path, l.burst, replicas, 100*demandFloor, l.params.Size*w*demandFloor, int(math.Ceil(float64(replicas)/demandFloor))))
		}
		if l.policy == Wait && l.maxWait >= EnvoyDefaultTimeout {
			out = append(out, fmt.Sprintf("%s: %s: warning: max_wait %s is not under Envoy's default rate-limit timeout of 20ms; raise the filter's timeout or Envoy will give up first",
				r.pos, r.path, l.maxWait))
		}
	}
	return out
}
