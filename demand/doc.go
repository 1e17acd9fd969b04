// Package demand divides a global limit among replicas by their demand, not
// evenly: Doorman's proportional share, computed from one snapshot of the
// replicas' reports.
//
// Why a package of its own: the rule is pure arithmetic that the leader (which
// divides) and every replica (which computes its own share from the leader's
// few parameters and its own report) must evaluate identically, and the
// reports and parameters cross process boundaries through Consul KV, so their
// encoding is versioned and checksummed. Keeping both here, free of Consul and
// of the engine, lets them be tested as a table, as a property over random
// demands, and by fuzzing, and lets the simulator run the same code.
//
// The rule, for one limit L shared by replicas with weight units u_i (Consul
// weights, 1 without them) and smoothed offered demands d_i:
//
//   - U is the units divided among (the leader's membership view, or the units
//     it saw reports from if more); E_i = L·u_i/U is replica i's equal share.
//   - A replica that wants no more than E_i gets what it wants plus headroom,
//     at least a floor, at most E_i: g_i = min(E_i, max(d_i·(1+h), f·E_i)).
//     What it leaves, E_i − g_i, adds up to the saving S.
//   - A replica that wants more gets E_i + K·(d_i − E_i), where X is the
//     excess Σ(d_j − E_j) of all such replicas and K = min(1, S/X).
//   - A replica whose report the division does not count (missing,
//     unreadable, of another version) gets E_i.
//   - What is still left, S − K·X, is spread evenly: everyone gets R·E_i more,
//     R = (S − K·X)/L.
//
// So Σ g_i ≤ L for every snapshot, and each replica's share follows from the
// published (U, h, f, K, R) and its own (u_i, d_i) alone, provided it uses
// the very report the leader used. The parameters therefore list the
// reports the division counted, each by the Consul index of its write and
// its node's tag; a replica that finds its own write there computes g_i
// from it, one that finds none takes at most E_i (what the leader left it),
// and one that finds its node at an index it did not write (a previous
// process's report, say) takes the floor f·E_i + R·E_i, the least any
// counted replica gets, never more than the leader left for that report.
//
// Apportion is the rule as one call: a budget divided among consumers by their
// demand, never looser than the budget. The leader divides each rule, and each
// hot value, with it.
//
// A rule with a bucket per value is divided this way value by value, for the
// values the leader makes hot (hot.go); every other value keeps E_i.
//
// It must never read a clock, the network or Consul, keep state of its own
// (History, Rates and Candidates are values their owner keeps and passes
// the time to), or divide more than the limit: bad figures count as no
// demand, and a rule it cannot evaluate leaves the equal share. The loop
// that meters, reports and applies shares is package demand/controller's.
package demand
