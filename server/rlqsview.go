package server

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"github.com/sharelimit/sharelimit/internal/human"
	"github.com/sharelimit/sharelimit/server/rlqs"
)

// SetRLQS gives the pages the RLQS service's snapshot: snap returns nil
// while no Envoy has opened a stream, and the pages then show no RLQS.
func (a *Admin) SetRLQS(snap func() *rlqs.Snapshot) { a.rlqs = snap }

// writeRLQS writes the RLQS section of /rlconfig's text: the streams, and
// each share with its parts and their sum against it.
func writeRLQS(w io.Writer, s *rlqs.Snapshot) {
	fmt.Fprintf(w, "rlqs: streams=%d bucket_ids=%d max=%d shares=%d reports=%d responses=%d", len(s.Streams), s.IDs, s.MaxBuckets, s.Shares, s.Reports, s.Pushes)
	for _, reason := range slices.Sorted(maps.Keys(s.Refusals)) {
		fmt.Fprintf(w, " %s=%d", reason, s.Refusals[reason])
	}
	w.Write([]byte("\n"))
	for _, st := range s.Streams {
		fmt.Fprintf(w, "rlqs stream %d: peer=%s domain=%q buckets=%d reports=%d open %s\n", st.ID, st.Peer, st.Domain, st.Buckets, st.Reports, seconds(st.AgeSeconds))
	}
	for _, b := range s.Buckets {
		fmt.Fprintf(w, "rlqs bucket %s %q: share %s burst %s; assigned %s burst %s;", b.Rule, strings.Join(b.IDs, " "),
			human.Rate(b.ShareRate, "second"), human.Number(b.ShareBurst), human.Rate(b.AssignedRate, "second"), human.Number(b.AssignedBurst))
		for _, p := range b.Parts {
			switch {
			case p.Ended:
				fmt.Fprintf(w, " ended %q %s", p.ID, human.Rate(p.Rate, "second"))
			case p.Stream == 0:
				fmt.Fprintf(w, " rls %s (demand %s)", human.Rate(p.Rate, "second"), human.Rate(p.Demand, "second"))
			default:
				fmt.Fprintf(w, " stream %d %q %s (demand %s)", p.Stream, p.ID, human.Rate(p.Rate, "second"), human.Rate(p.Demand, "second"))
			}
		}
		w.Write([]byte("\n"))
	}
	if s.Unlisted > 0 {
		fmt.Fprintf(w, "rlqs: %d more shares not listed\n", s.Unlisted)
	}
}
