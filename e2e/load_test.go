package e2e

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/status"
)

const (
	// tick is how often the dispatcher sends the requests that have fallen
	// due: at the rates used here, a request or two.
	tick = 5 * time.Millisecond
	// requestTimeout is generous next to Envoy's 20 ms: on a 2-core machine
	// running the race detector, a scheduling hiccup must not pass for a
	// failure of the daemon. Any answer later than this counts as an error.
	requestTimeout = 5 * time.Second
	// workers is how many requests may be in flight at once. A fixed pool
	// rather than a goroutine per request keeps the client's own CPU down:
	// under the race detector a fresh goroutine per call, and the growth of
	// its stack for the gRPC call, show in profiles.
	workers = 64
	// backlog is how many due requests may wait for a worker. Requests that
	// would exceed it are shed and counted; the scenarios require none.
	backlog = 8192
)

// Request outcomes, as a request's record keeps them.
const (
	unsent = iota // not (yet) sent: shed, or the load stopped first
	answeredOK
	answeredOver
	failed
)

// request is one request of the load: which daemon slot it went to, when it
// fell due, went out and was answered (or failed), since the load's start.
// The measurements come from the daemons' own accounting (measure_test.go);
// the requests say when the load ran late, and what it was told.
type request struct {
	slot                int
	due, sent, answered time.Duration
	outcome             int
}

// span is when the first and the last requests answered with a given
// current_limit fell due, since the start of the load.
type span struct{ first, last time.Duration }

// loadOpts shapes one run of the load.
type loadOpts struct {
	rate    float64       // offered requests per second, all daemons together
	max     time.Duration // the load stops by itself after this long
	weights []float64     // initial share of the requests per daemon slot
	// request builds request seq; nil sends envoyRequest, whose answers
	// must carry three statuses of which only the first may be over.
	request func(seq uint64) *rlsv3.RateLimitRequest
	// rule is the rule whose decisions the daemons' accounting is read for:
	// the one limit this load is meant to test. "" is clusterRule, the one
	// envoyRequest binds on.
	rule string
}

// load is an open-loop generator of Envoy-shaped ShouldRateLimit requests:
// requests go out at a fixed rate whether or not earlier ones were answered,
// as a stream of client requests reaches Envoy. Each is sent to one daemon,
// chosen by smooth weighted round robin over the slots, as a load balancer
// in front of the nodes would spread the clients. Its methods are safe for
// concurrent use, but for the measurements (measure_test.go), which read
// what it recorded once it has stopped.
type load struct {
	t       *testing.T
	c       *cluster
	rate    float64
	request func(seq uint64) *rlsv3.RateLimitRequest
	custom  bool // request is not envoyRequest
	rule    string
	max     time.Duration
	start   time.Time
	// requests is every request, by sequence number. Each is written by
	// the dispatcher, then by the one worker that sends it.
	requests []request
	// others are loads on the same cluster whose requests the rule also
	// decides: their decisions are taken out of this load's (see
	// shareRule).
	others []*load

	mu      sync.Mutex
	clients []rlsv3.RateLimitServiceClient
	weights []float64
	current []float64                  // smooth weighted round robin state
	pending []int                      // per slot: requests picked and not yet answered
	limits  []map[uint32]span          // per slot: current_limit → when seen
	errs    map[string]int             // error → count
	other   []*rlsv3.RateLimitResponse // answers whose secondary limits were over
	// accts are, per slot, the accounts of the processes that served it,
	// oldest first: a slot gets a new one when it is pointed at a restarted
	// daemon.
	accts [][]*acct

	sent       atomic.Int64
	shed       atomic.Int64
	lastAnswer atomic.Int64   // nanoseconds from the start to the last answer
	firstSend  []atomic.Int64 // per slot: nanoseconds from the start to its first request
	jobs       chan job
	workers    sync.WaitGroup
	stopOnce   sync.Once
	stopped    chan struct{}
	done       chan struct{}
	pollDone   chan struct{}
	finished   chan struct{} // closed once stop has read the last accounting
	// lags caches lag at each slot boundary once the load has stopped.
	lags map[int64]time.Duration
}

// startLoad starts sending requests to the cluster's daemons. It stops by
// itself after opts.max, or when stop is called, and at the latest when the
// test ends. While it runs it reads each daemon's accounting of opts.rule.
func startLoad(t *testing.T, c *cluster, opts loadOpts) *load {
	t.Helper()
	n := len(c.daemons)
	if len(opts.weights) != n {
		t.Fatalf("load: %d weights for %d daemons", len(opts.weights), n)
	}
	l := &load{
		t:         t,
		c:         c,
		rate:      opts.rate,
		request:   opts.request,
		custom:    opts.request != nil,
		rule:      opts.rule,
		max:       opts.max,
		requests:  make([]request, int(opts.rate*opts.max.Seconds())+2),
		clients:   make([]rlsv3.RateLimitServiceClient, n),
		weights:   slices.Clone(opts.weights),
		current:   make([]float64, n),
		pending:   make([]int, n),
		limits:    make([]map[uint32]span, n),
		accts:     make([][]*acct, n),
		firstSend: make([]atomic.Int64, n),
		errs:      map[string]int{},
		jobs:      make(chan job, backlog),
		stopped:   make(chan struct{}),
		done:      make(chan struct{}),
		pollDone:  make(chan struct{}),
		finished:  make(chan struct{}),
	}
	if l.request == nil {
		l.request = envoyRequest
	}
	if l.rule == "" {
		l.rule = clusterRule
	}
	for i, d := range c.daemons {
		l.firstSend[i].Store(math.MaxInt64)
		l.limits[i] = map[uint32]span{}
		if d != nil {
			l.clients[i] = d.rls
			l.accts[i] = []*acct{newAcct(c, d, l.rule)}
		}
		if l.weights[i] > 0 && l.clients[i] == nil {
			t.Fatalf("load: slot %d has weight %v but no daemon", i, l.weights[i])
		}
	}
	l.start = time.Now()
	for range workers {
		l.workers.Add(1)
		go l.work()
	}
	t.Cleanup(l.stop)
	go l.poll()
	go l.run()
	return l
}

// job is one request for a worker to send.
type job struct {
	slot   int
	client rlsv3.RateLimitServiceClient
	seq    uint64
	due    time.Duration // since the start of the load
}

func (l *load) work() {
	defer l.workers.Done()
	for j := range l.jobs {
		l.send(j)
	}
}

func (l *load) run() {
	defer close(l.done)
	defer close(l.jobs) // the workers finish what is queued, then exit
	tk := time.NewTicker(tick)
	defer tk.Stop()
	var seq uint64
	for {
		select {
		case <-l.stopped:
			return
		case <-tk.C:
		}
		el := time.Since(l.start)
		if el >= l.max {
			return
		}
		// Open loop: whatever fell due since the last tick goes out now,
		// even if the dispatcher was held up.
		for n := int64(l.rate*el.Seconds()) - l.sent.Load(); n > 0 && seq < uint64(len(l.requests)); n-- {
			due := time.Duration(float64(seq) / l.rate * float64(time.Second))
			l.sent.Add(1)
			slot, client := l.pick()
			l.requests[seq] = request{slot: slot, due: due}
			if client != nil {
				select {
				case l.jobs <- job{slot, client, seq, due}:
				default:
					l.shed.Add(1)
					l.answered(slot)
				}
			}
			seq++
		}
	}
}

// pick chooses the next daemon by smooth weighted round robin (nginx's): it
// spreads requests in the exact proportions of the weights, interleaved.
// The request counts as pending at its daemon until answered.
func (l *load) pick() (int, rlsv3.RateLimitServiceClient) {
	l.mu.Lock()
	defer l.mu.Unlock()
	best, total := -1, 0.0
	for i, w := range l.weights {
		if w <= 0 {
			continue
		}
		total += w
		l.current[i] += w
		if best < 0 || l.current[i] > l.current[best] {
			best = i
		}
	}
	if best < 0 {
		return -1, nil
	}
	l.current[best] -= total
	l.pending[best]++
	return best, l.clients[best]
}

// answered ends a request's time as pending at slot.
func (l *load) answered(slot int) {
	l.mu.Lock()
	l.pending[slot]--
	l.mu.Unlock()
}

// send makes request seq and records when it went out and was answered.
func (l *load) send(j job) {
	defer l.answered(j.slot)
	slot := j.slot
	sentAt := time.Since(l.start)
	storeMin(&l.firstSend[slot], int64(sentAt))
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	resp, err := j.client.ShouldRateLimit(ctx, l.request(j.seq))
	cancel()
	answered := time.Since(l.start)
	storeMax(&l.lastAnswer, int64(answered))
	r := &l.requests[j.seq]
	r.sent, r.answered = sentAt, answered
	if err != nil {
		r.outcome = failed
		st := status.Convert(err)
		l.mu.Lock()
		l.errs[fmt.Sprintf("%s: %s", st.Code(), st.Message())]++
		l.mu.Unlock()
		return
	}
	r.outcome = answeredOK
	if resp.OverallCode != rlsv3.RateLimitResponse_OK {
		r.outcome = answeredOver
	}
	// One status per descriptor, and only the first limit ever binds.
	unexpected := !l.custom && len(resp.Statuses) != 3
	for _, s := range resp.Statuses[min(1, len(resp.Statuses)):] {
		unexpected = unexpected || (!l.custom && s.Code != rlsv3.RateLimitResponse_OK)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if unexpected {
		l.other = append(l.other, resp)
	}
	if len(resp.Statuses) > 0 {
		rpu := resp.Statuses[0].GetCurrentLimit().GetRequestsPerUnit()
		s, seen := l.limits[slot][rpu]
		if !seen || j.due < s.first {
			s.first = j.due
		}
		s.last = max(s.last, j.due)
		l.limits[slot][rpu] = s
	}
}

// storeMin lowers v to x if x is smaller.
func storeMin(v *atomic.Int64, x int64) {
	for cur := v.Load(); x < cur && !v.CompareAndSwap(cur, x); cur = v.Load() {
	}
}

// storeMax raises v to x if x is larger.
func storeMax(v *atomic.Int64, x int64) {
	for cur := v.Load(); x > cur && !v.CompareAndSwap(cur, x); cur = v.Load() {
	}
}

// methods are the values of the request_headers action's :method entry.
var methods = [...]string{"GET", "GET", "POST", "GET", "PUT", "GET", "DELETE"}

// clientIPs are the values of the remote_address action: a crowd of clients.
var clientIPs = func() []string {
	ips := make([]string, 251)
	for i := range ips {
		ips[i] = fmt.Sprintf("10.%d.%d.%d", i%3, i%7, i+1)
	}
	return ips
}()

// envoyRequest is the request Envoy's rate-limit filter sends for a route
// with the three rate_limits actions described in testdata/edge.yaml.tmpl:
// one descriptor per action list, in route order.
func envoyRequest(seq uint64) *rlsv3.RateLimitRequest {
	ip := clientIPs[seq%uint64(len(clientIPs))]
	return &rlsv3.RateLimitRequest{
		Domain:     "edge",
		HitsAddend: 1,
		Descriptors: []*commonv3.RateLimitDescriptor{
			{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "generic_key", Value: "cluster"}}},
			{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: ip}}},
			{Entries: []*commonv3.RateLimitDescriptor_Entry{
				{Key: "generic_key", Value: "api"},
				{Key: "method", Value: methods[seq%uint64(len(methods))]},
			}},
		},
	}
}

// setWeights changes how the following requests are spread, as a load
// balancer does when it adds or removes a backend.
func (l *load) setWeights(w ...float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	copy(l.weights, w)
	clear(l.current)
}

// setTarget points slot i at a new daemon (a restarted process) with weight
// w; the new process's accounting is read from then on.
func (l *load) setTarget(i int, d *daemon, w float64) {
	a := newAcct(l.c, d, l.rule)
	a.fetch() // its first slots, before it has decided anything for the load
	l.mu.Lock()
	defer l.mu.Unlock()
	l.clients[i] = d.rls
	l.weights[i] = w
	l.accts[i] = append(l.accts[i], a)
	clear(l.current)
}

// retire reads the last of the accounting of slot i's daemon, which the
// load balancer has stopped sending to (its weight is 0): once its last
// requests are answered, it decides nothing more for the load, and its
// slots are complete. Call it before the daemon stops, and then nothing of
// what it decided is lost with the process.
func (l *load) retire(i int) {
	l.t.Helper()
	deadline := time.Now().Add(requestTimeout + time.Second)
	for {
		l.mu.Lock()
		w, pending, a := l.weights[i], l.pending[i], l.accts[i][len(l.accts[i])-1]
		l.mu.Unlock()
		if w > 0 {
			l.t.Fatalf("retire slot %d: its weight is %v; the load still sends to it", i, w)
		}
		if pending == 0 {
			if err := a.finish(); err != nil {
				l.t.Logf("%s: the last of its accounting could not be read (%v): what it decided since %s is unknown", a.node, err, a.knownThrough())
			}
			return
		}
		if time.Now().After(deadline) {
			l.t.Logf("%s: %d requests still pending %s after it was taken out; its accounting is read as it stands", a.node, pending, requestTimeout)
			a.fetch()
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// poll reads every daemon's accounting once a second while the load runs, so
// that nothing ages out of a daemon's ring (25.6 s) before it is read.
func (l *load) poll() {
	defer close(l.pollDone)
	tk := time.NewTicker(time.Second)
	defer tk.Stop()
	for {
		for _, a := range l.liveAccts() {
			a.fetch()
		}
		select {
		case <-l.stopped:
			return
		case <-l.done:
			return
		case <-tk.C:
		}
	}
}

// liveAccts are the accounts still to be read: of daemons that have not
// exited and were not read for the last time.
func (l *load) liveAccts() []*acct {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []*acct
	for _, as := range l.accts {
		for _, a := range as {
			if !a.isFinal() && !a.d.exited() {
				out = append(out, a)
			}
		}
	}
	return out
}

// firstSent is when, since the start, slot i got its first request: its
// buckets were created, full, no earlier.
func (l *load) firstSent(i int) time.Duration { return time.Duration(l.firstSend[i].Load()) }

// lastAnswered is when, since the start, the last answer came: no decision
// of the run was made later.
func (l *load) lastAnswered() time.Duration { return time.Duration(l.lastAnswer.Load()) }

// elapsed is the time since the load started.
func (l *load) elapsed() time.Duration { return time.Since(l.start) }

// sleepUntil sleeps until the load has run for at least d.
func (l *load) sleepUntil(d time.Duration) {
	if w := d - l.elapsed(); w > 0 {
		time.Sleep(w)
	}
}

// stop ends the load, waits for every request in flight, and reads the
// last of every running daemon's accounting. It is safe to call more than
// once, and from any goroutine.
func (l *load) stop() {
	l.stopOnce.Do(func() {
		close(l.stopped)
		<-l.done
		l.workers.Wait()
		<-l.pollDone
		for _, a := range l.liveAccts() {
			if err := a.finish(); err != nil {
				l.t.Logf("%s: the last of its accounting could not be read (%v): what it decided since %s is unknown", a.node, err, a.knownThrough())
			}
		}
		close(l.finished)
	})
}

// wait lets the load run to its end, then stops it.
func (l *load) wait() {
	<-l.done
	l.stop()
}

// totals counts every answer of the run to slot i, as the client saw them.
func (l *load) totals(slot int) (ok, over, errs int64) {
	return l.answers(0, time.Duration(math.MaxInt64), slot)
}

// answers counts, as the client saw them, the answers of slot to the
// requests due in [from, to). It needs the load stopped.
func (l *load) answers(from, to time.Duration, slot int) (ok, over, errs int64) {
	select {
	case <-l.finished:
	default:
		panic("e2e: a load's answers are counted before it has stopped")
	}
	for _, r := range l.requests[:l.sent.Load()] {
		if r.slot != slot || r.due < from || r.due >= to {
			continue
		}
		switch r.outcome {
		case answeredOK:
			ok++
		case answeredOver:
			over++
		case failed:
			errs++
		}
	}
	return ok, over, errs
}

// limitSpans returns, for slot i, when each current_limit was seen.
func (l *load) limitSpans(i int) map[uint32]span {
	l.mu.Lock()
	defer l.mu.Unlock()
	return maps.Clone(l.limits[i])
}

// checkClean fails the test if any request failed, was shed, or met a limit
// other than the global one: the scenarios all require a clean run.
func (l *load) checkClean(t *testing.T) {
	t.Helper()
	var errs int64
	for i := range l.clients {
		_, _, e := l.totals(i)
		errs += e
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if errs > 0 {
		var b strings.Builder
		for _, k := range slices.Sorted(maps.Keys(l.errs)) {
			fmt.Fprintf(&b, "\n  %d × %s", l.errs[k], k)
		}
		t.Errorf("%d of %d requests failed:%s", errs, l.sent.Load(), b.String())
	}
	if n := l.shed.Load(); n > 0 {
		t.Errorf("%d requests shed: more than %d waiting for a worker", n, backlog)
	}
	if len(l.other) > 0 {
		t.Errorf("%d answers were over a limit other than the global one, or malformed; first: %v", len(l.other), l.other[0])
	}
}
