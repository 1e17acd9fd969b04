package interop

import (
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
)

// answerCases is the sequence each client sends: every kind of answer, and
// every bad input, which must be refused without harm to the calls after it.
// Keys carry prefix p so that each client starts from fresh buckets.
func answerCases(p string) ([]request, []want) {
	user := func(v string) desc { return ds("user", p+v) }
	tooMany := make([]desc, 65)
	for i := range tooMany {
		tooMany[i] = ds("open", "x")
	}
	wideDesc := desc{}
	for range 33 {
		wideDesc.Entries = append(wideDesc.Entries, [2]string{"open", "x"})
	}
	perHour := func(n uint32) *limit { return &limit{RequestsPerUnit: n, Unit: hour} }
	cases := []struct {
		r request
		w want
	}{
		// OK, then the bucket spent, then OVER_LIMIT with nothing left.
		{rq(user("a")), answered(codeOK, okRemaining(9, perDay(10)))},
		{rq(user("a")).hits(9), answered(codeOK, okRemaining(0, perDay(10)))},
		{rq(user("a")), answered(codeOver, over(perDay(10)))},
		// Several descriptors: one status each, in order; one over is
		// enough for OVER_LIMIT overall.
		{rq(user("b"), ds("blocked", "x"), ds("open", "y"), ds("nomatch", "z")),
			answered(codeOver, okRemaining(9, perDay(10)), over(perDay(0)), unlimited, noRule)},
		// hits_addend: a descriptor's own wins (0 is a check), else the
		// request's.
		{rq(user("c").hits(3), user("d").hits(0), user("f")).hits(2),
			answered(codeOK, okRemaining(7, perDay(10)), okRemaining(10, perDay(10)), okRemaining(8, perDay(10)))},
		// A draw larger than what is left fails and spends nothing.
		{rq(user("c").hits(8)), answered(codeOver, over(perDay(10)))},
		{rq(user("c").hits(7)), answered(codeOK, okRemaining(0, perDay(10)))},
		// A per-request limit override.
		{rq(user("e").limit(5, hour)), answered(codeOK, okRemaining(4, perHour(5)))},
		{rq(user("e").limit(5, hour)).hits(4), answered(codeOK, okRemaining(0, perHour(5)))},
		{rq(user("e").limit(5, hour)), answered(codeOver, over(perHour(5)))},
		// Bad input: InvalidArgument, naming the field.
		{request{Descriptors: []desc{user("g")}}, failed(codes.InvalidArgument, "domain")},
		{rq(), failed(codes.InvalidArgument, "descriptors")},
		{rq(desc{}), failed(codes.InvalidArgument, "descriptors[0].entries")},
		{rq(ds("", "v")), failed(codes.InvalidArgument, "descriptors[0].entries[0].key")},
		{rq(user("g").limit(5, 0)), failed(codes.InvalidArgument, "descriptors[0].limit.unit")},
		{rq(user("g").limit(0, hour)), failed(codes.InvalidArgument, "descriptors[0].limit.requests_per_unit")},
		{rq(tooMany...), failed(codes.InvalidArgument, "descriptors")},
		{rq(wideDesc), failed(codes.InvalidArgument, "descriptors[0].entries")},
		{rq(ds(strings.Repeat("k", 257), "v")), failed(codes.InvalidArgument, "descriptors[0].entries[0].key")},
		{rq(ds("open", strings.Repeat("v", 4097))), failed(codes.InvalidArgument, "descriptors[0].entries[0].value")},
		{rq(user("g").hits(math.MaxUint32 + 1)), failed(codes.InvalidArgument, "descriptors[0].hits_addend")},
		// A message over the 1 MiB cap.
		{request{Domain: strings.Repeat("d", 1<<20+1), Descriptors: []desc{user("g")}}, failed(codes.ResourceExhausted, "")},
		// The daemon still serves, and no bad input spent a token.
		{rq(user("g")), answered(codeOK, okRemaining(9, perDay(10)))},
	}
	var rs []request
	var ws []want
	for _, c := range cases {
		rs = append(rs, c.r)
		ws = append(ws, c.w)
	}
	return rs, ws
}

// TestAnswers: every kind of answer and every bad input, through C-core,
// grpc-js and curl, one call after another on one connection each.
func TestAnswers(t *testing.T) {
	forEachTransport(t, func(t *testing.T, d *daemon) {
		for _, client := range grpcClients {
			t.Run(client, func(t *testing.T) {
				reqs, wants := answerCases(client + "-")
				var cs []call
				for _, r := range reqs {
					cs = append(cs, one(r))
				}
				r := runPlan(t, client, plan{Target: d.grpcAddr, Steps: []step{calls(false, cs...)}}, time.Minute)
				expect(t, client, r.results(t, 0), wants)
			})
		}
		t.Run(curl, func(t *testing.T) {
			tp := newTap(t, d.grpcAddr)
			reqs, wants := answerCases("curl-")
			var got []result
			for _, r := range reqs {
				got = append(got, curlTapped(t, tp, r))
			}
			expect(t, curl, got, wants)
		})
	})
}
