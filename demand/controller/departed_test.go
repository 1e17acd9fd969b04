package controller

import (
	"context"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/demand"
)

// A replica that dies or restarts may leave Envoys enforcing its share
// through RLQS assignments until those expire. For Config.Hold after the
// leader finds it gone or restarted, or after a leader takes the lead from
// another leader or process, the division in force stands; only then do the
// others take its share over.
func TestDepartedReplicaKeepsItsShareForHold(t *testing.T) {
	// Longer than the replicas' history of reports at one a second.
	const hold = 3 * demand.HistoryLen * time.Second
	for _, fault := range []string{"node leaves", "report gone", "both", "new process", "new leader", "leader restarts"} {
		t.Run(fault, func(t *testing.T) {
			cl := newCluster(t, 4)
			passing := []string{"n1", "n2", "n3", "n4"}
			for _, r := range cl.reps {
				r.c.set.Hold = hold
				r.c.set.Passing = func() []string { return passing }
			}
			// n2 is busy; the others are not.
			cl.run(3*time.Second, 10, 1000, 10, 10)
			leader := cl.reps[0]
			if fault == "leader restarts" {
				leader = cl.reps[1]
			}
			inForce := leader.params(t, cl.kv)
			cl.deliver(inForce)
			cl.settle(leader.c.growDelay())
			dead := cl.reps[1].weight(shared)
			if dead < 0.5 {
				t.Fatalf("busy n2 has %.4f of L, want most of it", dead)
			}
			// n2's process ends: its Envoys go on enforcing dead for up
			// to hold, and its load moves to n3.
			session := "s-n2"
			var restarted *replica
			switch fault {
			case "node leaves":
				passing = []string{"n1", "n3", "n4"}
			case "report gone":
				cl.kv.drop("n2")
			case "both":
				passing = []string{"n1", "n3", "n4"}
				cl.kv.drop("n2")
			case "new process":
				session = "s-n2-again" // its report stands, under a new session
			case "new leader":
				// n3 takes the lead, having never divided, and ends n2's
				// session: it knows n2 only from the division in force.
				passing = []string{"n1", "n3", "n4"}
				cl.kv.drop("n2")
				leader = cl.reps[2]
			case "leader restarts":
				// n2 leads, and restarts: what it knew went with it, and
				// its new process reports what it has metered since.
				restarted = newReplica(t, "n2", 4, cl.kv, cl.clock, Rule{Identity: shared, Path: "k_v", Limit: 400})
				restarted.c.set.Hold = hold
				restarted.c.set.Passing = func() []string { return passing }
				restarted.c.onParams(inForce, 0)
				leader = restarted
			}
			survivors := []*replica{cl.reps[0], cl.reps[2], cl.reps[3]}
			ticks := 0
			step := func(d time.Duration) {
				for range int(d / tickEvery) {
					cl.clock.Advance(tickEvery)
					ticks++
					// Their demand swings every second, and so do their
					// reports.
					swing := 0.5 + float64(ticks/int(time.Second/tickEvery)%2)
					for i, r := range survivors {
						n := uint64([]float64{10, 1000, 10}[i] * swing * tickEvery.Seconds())
						r.eng.meter(shared, 0, n, min(n, 10))
						r.c.tick(context.Background())
					}
					if restarted != nil {
						restarted.c.tick(context.Background())
					}
				}
				snap := cl.kv.snapshot()
				for i := range snap.Reports {
					if snap.Reports[i].Node == "n2" {
						snap.Reports[i].Session = session
					}
				}
				b, err := leader.c.divide(snap)
				if err != nil {
					t.Fatal(err)
				}
				for _, r := range append(survivors, restarted) {
					if r != nil {
						r.c.onParams(b, 0)
					}
				}
				cl.clock.Advance(leader.c.growDelay())
				for _, r := range survivors {
					r.c.apply(cl.clock.Now())
				}
			}
			sum := func() float64 {
				s := 0.0
				for _, r := range survivors {
					s += r.weight(shared)
				}
				return s
			}
			// Their shares stand as they were: neither more, nor (once their
			// reports of then are older than their history) the least.
			before := sum()
			for elapsed := time.Duration(0); elapsed < hold-5*time.Second; elapsed += 3*time.Second + leader.c.growDelay() {
				step(3 * time.Second)
				if s := sum(); s+dead > 1+1e-9 {
					t.Fatalf("%v after n2's process ended, the others take %.4f of L beside the %.4f its Envoys may still enforce", elapsed, s, dead)
				} else if s < before-1e-9 {
					t.Fatalf("%v after n2's process ended, the others take %.4f of L, less than the %.4f they had", elapsed, s, before)
				}
			}
			cl.clock.Advance(hold)
			step(3 * time.Second)
			// n2's share passes on: all of it if n2 is still counted (its
			// report, at its demand, went on), else but for its equal share
			// while the views still count four replicas.
			if s := sum(); s < 0.7 && fault != "new process" && fault != "leader restarts" {
				t.Fatalf("after the hold, the others take %.4f of L, want at least 0.7", s)
			}
		})
	}
}

// A replica's next process, taking its key over, adopts the report the
// previous one left: under the division in force, which counted that
// report, it keeps the share its Envoys may still enforce parts of, rather
// than the least share. Without a hold, nothing is adopted.
func TestRestartedReplicaAdoptsItsReport(t *testing.T) {
	for _, hold := range []time.Duration{15 * time.Second, 0} {
		t.Run(hold.String(), func(t *testing.T) {
			cl := newCluster(t, 4)
			for _, r := range cl.reps {
				r.c.set.Hold = hold
			}
			cl.run(3*time.Second, 10, 1000, 10, 10)
			inForce := cl.reps[0].params(t, cl.kv)
			cl.deliver(inForce)
			cl.settle(cl.reps[0].c.growDelay())
			was := cl.reps[1].weight(shared)
			cl.kv.mu.Lock()
			left := cl.kv.reports["n2"]
			cl.kv.mu.Unlock()

			next := newReplica(t, "n2", 4, cl.kv, cl.clock, Rule{Identity: shared, Path: "k_v", Limit: 400})
			next.c.set.Hold = hold
			next.st.adopt = &left
			next.c.onParams(inForce, 0)
			for range 10 { // its first report goes out
				cl.clock.Advance(tickEvery)
				next.eng.meter(shared, 0, 1, 1)
				next.c.tick(context.Background())
			}
			next.c.apply(cl.clock.Now())
			got := next.weight(shared)
			switch {
			case hold > 0 && (got < was-1e-9 || got > was+1e-9):
				t.Fatalf("the next process takes %.4f of L, want the %.4f the division in force gave n2", got, was)
			case hold == 0 && got >= was:
				t.Fatalf("without a hold the next process takes %.4f of L, want less than the %.4f of the report it did not write", got, was)
			}
		})
	}
}

// When the parameters go stale (the leader died and its node still passes,
// so nobody takes the lead before its session expires), every replica
// falls back to its equal share. With a hold, a replica below its equal
// share grows to it only once the hold has passed as well: the dead
// leader's Envoys may enforce its share that long after its last answer.
func TestStaleParamsGrowWaitsTheHold(t *testing.T) {
	for _, hold := range []time.Duration{15 * time.Second, 0} {
		t.Run(hold.String(), func(t *testing.T) {
			cl := newCluster(t, 4)
			for _, r := range cl.reps {
				r.c.set.Hold = hold
			}
			cl.run(3*time.Second, 10, 1000, 10, 10)
			cl.deliver(cl.reps[0].params(t, cl.kv))
			cl.settle(cl.reps[0].c.growDelay())
			small := cl.reps[0]
			was := small.weight(shared)
			if was >= 0.25 {
				t.Fatalf("n1 has %.4f of L, want less than its equal share", was)
			}
			stale := small.c.staleAfter()
			// No parameters come any more; n1 meters on.
			step := func(d time.Duration) {
				for range int(d / tickEvery) {
					cl.clock.Advance(tickEvery)
					small.eng.meter(shared, 0, 1, 1)
					small.c.tick(context.Background())
				}
			}
			step(stale + small.c.growDelay() + time.Second)
			got := small.weight(shared)
			switch {
			case hold > 0 && got > was+1e-9:
				t.Fatalf("%v after the last parameters, n1 grew from %.4f to %.4f before the hold", stale+small.c.growDelay()+time.Second, was, got)
			case hold == 0 && got < 0.25-1e-9:
				t.Fatalf("without a hold, n1 has %.4f once the parameters are stale, want its equal share", got)
			}
			step(hold)
			if got := small.weight(shared); got < 0.25-1e-9 {
				t.Fatalf("after the hold too, n1 has %.4f, want its equal share", got)
			}
		})
	}
}
