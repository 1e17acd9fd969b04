package engine

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// TestGiveBackRestoresTheReservation is a property test of the give-back:
// over random configs of policy: wait rules (exact, key-only, wildcard and
// nested; shared by the cluster, the replica or demand, some values hot,
// some rules ramping after a reload, some stores at their cap), a request
// whose every wait-policy descriptor must wait, refused by another
// descriptor, leaves every bucket exactly as it found it, and every demand
// meter's admitted count too. A give-back that went to another bucket than
// its reservation (another key, overflow key, group or hot value) would
// leave the reserved bucket short and could fill another.
func TestGiveBackRestoresTheReservation(t *testing.T) {
	t.Parallel()
	var seen [4]atomic.Int32 // cases with give-backs, hot values, overflow, ramps
	t.Run("seeds", func(t *testing.T) {
		for seed := range uint64(400) {
			t.Run(fmt.Sprint(seed), func(t *testing.T) {
				t.Parallel()
				for i, ok := range giveBackCase(t, rand.New(rand.NewPCG(seed, 32))) {
					if ok {
						seen[i].Add(1)
					}
				}
			})
		}
	})
	// The fixture must reach every way a bucket request is routed.
	for i, what := range []string{"give-backs", "hot values", "overflow buckets", "ramps"} {
		n := seen[i].Load()
		t.Logf("%d of 400 cases had %s", n, what)
		if n < 20 {
			t.Errorf("only %d of 400 cases had %s", n, what)
		}
	}
}

// waitRig is one random config and the requests that can be made of it.
type waitRig struct {
	yaml  string
	kinds []int // per rule kI: 0 exact, 1 key-only, 2 wildcard, 3 nested
	share []string
}

var waitValues = []string{"a", "b", "c", "d", "e"}

func randomWaitRig(r *rand.Rand) waitRig {
	var b strings.Builder
	b.WriteString("domain: g\ndescriptors:\n")
	b.WriteString("  - key: stop\n    value: x\n    rate_limit: {unit: second, requests_per_unit: 0}\n")
	g := waitRig{}
	for i := range 1 + r.IntN(4) {
		kind := r.IntN(4)
		share := []string{"cluster", "replica", "demand"}[r.IntN(3)]
		g.kinds, g.share = append(g.kinds, kind), append(g.share, share)
		lim := fmt.Sprintf("rate_limit: {unit: second, requests_per_unit: %d, burst: %d, share: %s, policy: wait, max_wait: 1h}",
			1+r.IntN(20), 1+r.IntN(30), share)
		switch kind {
		case 0:
			fmt.Fprintf(&b, "  - key: k%d\n    value: a\n    %s\n", i, lim)
		case 1:
			fmt.Fprintf(&b, "  - key: k%d\n    %s\n", i, lim)
		case 2:
			fmt.Fprintf(&b, "  - key: k%d\n    value: \"b*\"\n    %s\n", i, lim)
		case 3:
			fmt.Fprintf(&b, "  - key: k%d\n    descriptors:\n      - key: s\n        %s\n", i, lim)
		}
	}
	g.yaml = b.String()
	return g
}

// descriptor returns a random request descriptor for rule i.
func (g waitRig) descriptor(r *rand.Rand, i int) *commonv3.RateLimitDescriptor {
	k, v := fmt.Sprintf("k%d", i), waitValues[r.IntN(len(waitValues))]
	var d *commonv3.RateLimitDescriptor
	switch g.kinds[i] {
	case 0:
		d = desc(k + "=a")
	case 1:
		d = desc(k + "=" + v)
	case 2:
		d = desc(k + "=b" + v)
	default:
		d = desc(k+"="+v, "s="+waitValues[r.IntN(len(waitValues))])
	}
	if r.IntN(3) == 0 {
		d.HitsAddend = wrapperspb.UInt64(uint64(1 + r.IntN(3)))
	}
	return d
}

// giveBackCase runs one random case and reports what it reached: a
// give-back, a hot value, an overflow bucket, a ramp.
func giveBackCase(t *testing.T, r *rand.Rand) (reached [4]bool) {
	g := randomWaitRig(r)
	set, err := descriptors.Compile(descriptors.File{Name: "g.yaml", Data: []byte(g.yaml)})
	if err != nil {
		t.Fatalf("%v\n%s", err, g.yaml)
	}
	capacity := 0
	if r.IntN(3) == 0 {
		capacity = 2 + r.IntN(4) // some keys overflow
	}
	e := newEngine(t, nil, bucket.NewStore(capacity), Options{Weight: []float64{1, 0.5, 0.25}[r.IntN(3)], DemandAll: r.IntN(2) == 0})
	now := int64(1e9)
	if r.IntN(3) == 0 {
		// A reload that retires a rule and adds these: they ramp.
		old, err := descriptors.Compile(descriptors.File{Name: "g.yaml", Data: []byte("domain: g\ndescriptors:\n  - key: old\n    rate_limit: {unit: second, requests_per_unit: 5}\n")})
		if err != nil {
			t.Fatal(err)
		}
		e.SwapAt(old, 0)
		e.SwapAt(set, now/2)
	} else {
		e.Swap(set)
	}
	// Some values of per-value demand rules are hot, at their own weight.
	var meters []func() (uint64, uint64)
	hot := false
	for _, b := range e.DemandRules() {
		meters = append(meters, b.State.Counts)
		if !b.State.PerValue() || r.IntN(2) == 0 {
			continue
		}
		var ids []uint64
		for range 1 + r.IntN(3) {
			i := int(b.Rule.Path()[len("g.k")] - '0')
			d := g.descriptor(r, i)
			ids = append(ids, ValueID(b.State.RuleID(), e.Set().Match("g", d.Entries), d.Entries))
		}
		for _, h := range e.SetHot(b.State, ids, now) {
			e.SetGroupWeight(h.Group(), []float64{1, 0.3, 0.7}[r.IntN(3)], now)
			meters = append(meters, h.Counts)
			hot = true
		}
	}
	// The request: wait-policy descriptors, some twice, and the refusing one.
	var descs []*commonv3.RateLimitDescriptor
	for range 1 + r.IntN(6) {
		descs = append(descs, g.descriptor(r, r.IntN(len(g.kinds))))
	}
	stop := desc("stop=x")
	descs = append(descs, stop)
	r.Shuffle(len(descs), func(i, j int) { descs[i], descs[j] = descs[j], descs[i] })
	hits := uint32(1 + r.IntN(3))
	// Empty every bucket the request draws from, so that every draw of it
	// waits: one that did not would keep its tokens, as it should.
	for _, d := range descs {
		if d == stop {
			continue
		}
		for range 200 {
			out, _, err := decide(e, "g", []*commonv3.RateLimitDescriptor{{Entries: d.Entries}}, 1, now, nil)
			if err != nil {
				t.Fatal(err)
			}
			if out[0].Wait > 0 || out[0].Code == OverLimit {
				break
			}
		}
	}
	before, meterBefore := levels(e, now), counts(meters)
	out, code, err := decide(e, "g", descs, hits, now, nil)
	if err != nil {
		t.Fatal(err)
	}
	if code != OverLimit {
		t.Fatalf("the request passed: %+v", out)
	}
	waited := false
	for i, st := range out {
		// Every bucket was empty: a limited descriptor answered OK reserved
		// its tokens, and was given them back.
		waited = waited || st.Code == OK && st.Limit != nil
		if st.Wait != 0 {
			t.Errorf("descriptor %d still waits %v after the refusal", i, st.Wait)
		}
	}
	after := levels(e, now)
	for k, b := range before {
		a, ok := after[k]
		if !ok {
			a.Fill = 1
		}
		if math.Abs(a.Fill-b.Fill) > 1e-9 || a.Group != b.Group {
			t.Errorf("bucket %x: fill %v group %d before, %v group %d after", k, b.Fill, b.Group, a.Fill, a.Group)
		}
	}
	for k, a := range after {
		if _, ok := before[k]; !ok {
			t.Errorf("bucket %x: new after the refused request, fill %v", k, a.Fill)
		}
	}
	if m := counts(meters); fmt.Sprint(m) != fmt.Sprint(meterBefore) {
		t.Errorf("demand meters (offered, admitted) %v before, %v after", meterBefore, m)
	}
	if t.Failed() {
		t.Logf("config:\n%s\nstore cap %d, hits %d, request %v", g.yaml, capacity, hits, descs)
	}
	return [4]bool{waited, hot, e.Store().Overflowed() > 0, len(e.Ramping(now)) > 0}
}

// levels returns every bucket of e's store that is not full at now, by key.
func levels(e *Engine, now int64) map[uint64]bucket.Saved {
	ws := make([]*bucket.Weight, e.groups.Load())
	for i := range ws {
		ws[i] = e.weights[i].Load()
	}
	out := map[uint64]bucket.Saved{}
	e.Store().Export(ws, now, func(batch []bucket.Saved) {
		for _, b := range batch {
			out[b.Key] = b
		}
	})
	return out
}

// counts returns the admitted count of each meter: a refused request's
// give-back undoes what its reservations counted as admitted, while what
// they were offered stays offered.
func counts(meters []func() (uint64, uint64)) []uint64 {
	out := make([]uint64, len(meters))
	for i, m := range meters {
		_, out[i] = m()
	}
	return out
}

// TestWaitIsCancelledWhenTheRequestIsRefused: a wait-policy descriptor next to
// an over-limit one gives an overall OVER_LIMIT. The answer is not held, and
// the reserved tokens go back.
func TestWaitIsCancelledWhenTheRequestIsRefused(t *testing.T) {
	d := newDecider(t, `
domain: d
descriptors:
  - key: wait
    rate_limit: {unit: second, requests_per_unit: 100, burst: 1, policy: wait, max_wait: 15ms}
  - key: block
    rate_limit: {unit: second, requests_per_unit: 0}
`, 1)
	if _, code := d.decide(desc("wait=a")); code != "OK" { // the only token
		t.Fatal("first draw refused")
	}
	out, code := d.decide(desc("wait=a"), desc("block=b"))
	if code != "OVER_LIMIT" {
		t.Fatalf("overall %s", code)
	}
	if out[0].Wait != 0 {
		t.Fatalf("a refused request is held for %v", out[0].Wait)
	}
	// Had the reservation been kept, this draw would have to wait 20 ms, past
	// max_wait; with it given back it waits 10 ms.
	out, code = d.decide(desc("wait=a"))
	if code != "OK" || out[0].Wait != 10*time.Millisecond {
		t.Fatalf("after the refused request: %s, wait %v", code, out[0].Wait)
	}
}
