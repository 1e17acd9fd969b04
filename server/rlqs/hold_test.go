package rlqs

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
)

// ttlEnvoy is modelLimiter with Envoy's assignment time to live (whole
// seconds, restarted by every action): on expiry the recommended
// expired_assignment_behavior (DENY_ALL) drops the limiter, so the next
// token bucket builds a new, full one.
type ttlEnvoy struct {
	l       modelLimiter
	expires int64
	denyAll bool
}

func (e *ttlEnvoy) pump(st *stream, now int64) {
	for len(st.queue) > 0 {
		a := <-st.queue
		for _, m := range a.msgs {
			for _, x := range m.GetBucketAction() {
				e.check(now)
				e.l.apply(x, now)
				e.expires = now + x.GetQuotaAssignmentAction().GetAssignmentTimeToLive().GetSeconds()*int64(time.Second)
				e.denyAll = false
			}
		}
	}
}

func (e *ttlEnvoy) check(now int64) {
	if e.l.has && now >= e.expires {
		e.l.has, e.denyAll = false, true
	}
}

// With --rlqs-ttl under Envoy's fixed 5 s report interval (config accepts
// 1 s to 1 h), every assignment expires before the report that renews it.
// With the recommended DENY_ALL fallback Envoy then drops its limiter, and
// the renewal builds a new, full one each period: the paced burst is a
// whole fresh burst every 5 s, whatever pacing decides. (With Envoy's
// default fallback, ALLOW_ALL, the gap admits everything.)
func TestExpiredAssignmentStartsSmallAgain(t *testing.T) {
	for _, ttl := range []time.Duration{4 * time.Second, 5 * time.Second, 15 * time.Second} {
		t.Run(ttl.String(), func(t *testing.T) { ttlRefill(t, ttl) })
	}
}

func ttlRefill(t *testing.T, ttl time.Duration) {
	const (
		rate, burst = 10.0, 100.0
		dt          = 50 * time.Millisecond
		steps       = 8000 // 400 s
	)
	eng := newFakeEngine()
	clock := &fakeClock{}
	clock.ns.Store(int64(time.Hour))
	eng.limit("edge", "tenant=a", 1, rate, burst, 1)
	svc, err := New(Options{Engine: eng, Clock: clock.now, TTL: ttl, Hold: 200 * time.Millisecond, AbandonAfter: time.Minute, Queue: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	id := map[string]string{"tenant": "a"}
	st := svc.open(func(error) {}, "e")
	var env ttlEnvoy
	var allowed, denied uint64
	per := make([]int, steps)
	// A report answered 1 ms late now and then (a busy divider, the
	// network): the renewal of a 5 s TTL then lands after its expiry.
	var skew time.Duration
	for s := range steps {
		clock.advance(dt - skew)
		skew = 0
		svc.Tick()
		env.pump(st, clock.now())
		if s%100 == 0 {
			el := 5 * time.Second
			if s == 0 {
				el = 0
			}
			if s%200 == 0 && s > 0 {
				skew = time.Millisecond // this answer lands 1 ms late
				clock.advance(skew)
			}
			svc.report(st, report("edge", usage(id, allowed, denied, el)))
			allowed, denied = 0, 0
			env.pump(st, clock.now())
		}
		env.check(clock.now())
		if env.l.has {
			k := env.l.drain(clock.now())
			per[s] += k
			allowed += uint64(k)
		}
		denied += 10
	}
	worst, at, span := worstOverBucket(per, 2000, 400, burst, rate, dt) // after the burst has grown (100 s)
	total := 0
	for _, k := range per[2000:] {
		total += k
	}
	t.Logf("ttl %s: admitted %.1f/s over the last 300 s (the key: %.0f/s); worst window %.0f over B + R·t", ttl, float64(total)/300, rate, worst)
	if worst > 1 {
		t.Fatalf("ttl %s: %.0f over B + R·t in %.1f s from %.1f s", ttl, worst, float64(span)*dt.Seconds(), float64(at)*dt.Seconds())
	}
}

// The bytes bound counts an id's keys and values, not its domain, though
// each id's table key (idKey) holds the domain too: a report's domain may
// be 4096 bytes (engine.MaxValueBytes), and it need not be known (an
// unknown domain's ids are stored, DENY_ALL, while they are reported).
// Ids of 9 counted bytes then each hold over 4 KiB: --max-buckets (1e6 by
// default) of them is about 4 GiB while idBytes counts 9 MB.
func TestIDBytesCountTheDomain(t *testing.T) {
	const budget = 16 << 20
	eng := newFakeEngine()
	clock := &fakeClock{}
	clock.ns.Store(int64(time.Hour))
	svc, err := New(Options{Engine: eng, Clock: clock.now, AbandonAfter: time.Minute, MaxBuckets: 1_000_000, MaxIDBytes: budget, Queue: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	st := svc.open(func(error) {}, "x")
	domain := strings.Repeat("d", 4096)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	const n = 12_000
	for i := 0; i < n; i += 100 {
		var us []*rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage
		for j := i; j < i+100; j++ {
			us = append(us, usage(map[string]string{"k": fmt.Sprintf("%08d", j)}, 1, 0, 0))
		}
		r := report(domain, us...)
		if err := validate(r, st); err != nil {
			t.Fatal(err)
		}
		svc.report(st, r)
		for len(st.queue) > 0 {
			a := <-st.queue
			st.unsent.Add(-a.bytes)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	svc.mu.Lock()
	ids, held := len(svc.ids), svc.idBytes
	svc.mu.Unlock()
	grown := float64(after.HeapAlloc) - float64(before.HeapAlloc)
	t.Logf("%d ids, %d bytes of them counted, %.1f MiB of heap (bound %d MiB)", ids, held, grown/(1<<20), budget>>20)
	if grown > 3*budget {
		t.Fatalf("the heap grew %.1f MiB for a bound of %d MiB of ids (%d bytes counted)", grown/(1<<20), budget>>20, held)
	}
}

// A small share over many Envoys is in wholeTokens' regime: a token each
// for the streams with the most demand, DENY_ALL for the rest. Envoys
// whose reported demand alternates (a burst of denied requests in one
// period, none in the next) move the tokens between streams: the one that
// loses its token is sent DENY_ALL (its limiter, drained, is dropped), the
// one that gains it gets a token bucket after none, which Envoy builds
// full. Each move is a whole token no refill made, and pacing cannot stop
// it (rampStart is 1, and one token is the whole part).
func TestTokensMoveInWholeTokens(t *testing.T) {
	const (
		rate, burst = 4.0, 4.0
		dt          = 50 * time.Millisecond
		steps       = 2400 // 120 s
		n           = 8
	)
	eng := newFakeEngine()
	clock := &fakeClock{}
	clock.ns.Store(int64(time.Hour))
	eng.limit("edge", "tenant=a", 1, rate, burst, 1)
	svc, err := New(Options{Engine: eng, Clock: clock.now, Hold: 200 * time.Millisecond, AbandonAfter: time.Minute, Queue: 1 << 10})
	if err != nil {
		t.Fatal(err)
	}
	id := map[string]string{"tenant": "a"}
	sts := make([]*stream, n)
	ls := make([]modelLimiter, n)
	allowed := make([]uint64, n)
	period := make([]int, n)
	for i := range sts {
		sts[i] = svc.open(func(error) {}, "e")
	}
	per := make([]int, steps)
	fresh := 0
	for s := range steps {
		clock.advance(dt)
		svc.Tick()
		for i := range sts {
			had := ls[i].has
			pumpInto(sts[i], &ls[i], clock.now())
			if !had && ls[i].has {
				fresh++
			}
			if s%100 == i*100/n {
				el := 5 * time.Second
				if s < 100 {
					el = 0
				}
				var denied uint64
				if (period[i]+i)%n == 0 {
					denied = 500 // a flood this period, one Envoy at a time
				}
				period[i]++
				svc.report(sts[i], report("edge", usage(id, allowed[i], denied, el)))
				allowed[i] = 0
				pumpInto(sts[i], &ls[i], clock.now())
			}
			if ls[i].has {
				k := ls[i].drain(clock.now())
				per[s] += k
				allowed[i] += uint64(k)
			}
		}
	}
	worst, at, span := worstOverBucket(per, 200, 400, burst, rate, dt)
	total := 0
	for _, k := range per[200:] {
		total += k
	}
	t.Logf("admitted %.2f/s over the last 110 s (the key: %.0f/s), %d limiters built new; worst window %.0f over B + R·t", float64(total)/110, rate, fresh, worst)
	if worst > 1 {
		t.Fatalf("%.0f over B + R·t in %.1f s from %.1f s", worst, float64(span)*dt.Seconds(), float64(at)*dt.Seconds())
	}
}
