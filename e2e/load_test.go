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
	// binWidth is the resolution of every measurement: answers are counted
	// per daemon per bin, by the time their request fell due.
	binWidth = 100 * time.Millisecond
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
	// onTime is how late an answer may come, after its request fell due,
	// for its bin to count as on time; see stable.
	onTime = 50 * time.Millisecond
)

// counts are the answers of one daemon to the requests due in one bin.
type counts struct {
	ok, over, errs atomic.Int64
	// late is the most any of those requests was answered after it fell
	// due, in nanoseconds: how far the client or the daemon lagged.
	late atomic.Int64
	// sendLate is the most any of them went out after it fell due: how far
	// the client alone lagged.
	sendLate atomic.Int64
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
}

// load is an open-loop generator of Envoy-shaped ShouldRateLimit requests:
// requests go out at a fixed rate whether or not earlier ones were answered,
// as a stream of client requests reaches Envoy. Each is sent to one daemon,
// chosen by smooth weighted round robin over the slots, as a load balancer
// in front of the nodes would spread the clients. Its methods are safe for
// concurrent use.
type load struct {
	rate    float64
	request func(seq uint64) *rlsv3.RateLimitRequest
	custom  bool // request is not envoyRequest
	max     time.Duration
	start   time.Time
	bins    [][]counts // [slot][bin]

	mu      sync.Mutex
	clients []rlsv3.RateLimitServiceClient
	weights []float64
	current []float64                  // smooth weighted round robin state
	limits  []map[uint32]span          // per slot: current_limit → when seen
	errs    map[string]int             // error → count
	other   []*rlsv3.RateLimitResponse // answers whose secondary limits were over

	sent       atomic.Int64
	shed       atomic.Int64
	lastAnswer atomic.Int64   // nanoseconds from the start to the last answer
	firstSend  []atomic.Int64 // per slot: nanoseconds from the start to its first request
	jobs       chan job
	workers    sync.WaitGroup
	stopOnce   sync.Once
	stopped    chan struct{}
	done       chan struct{}
}

// startLoad starts sending requests to the cluster's daemons. It stops by
// itself after opts.max, or when stop is called, and at the latest when the
// test ends.
func startLoad(t *testing.T, c *cluster, opts loadOpts) *load {
	t.Helper()
	n := len(c.daemons)
	if len(opts.weights) != n {
		t.Fatalf("load: %d weights for %d daemons", len(opts.weights), n)
	}
	l := &load{
		rate:      opts.rate,
		request:   opts.request,
		custom:    opts.request != nil,
		max:       opts.max,
		bins:      make([][]counts, n),
		clients:   make([]rlsv3.RateLimitServiceClient, n),
		weights:   slices.Clone(opts.weights),
		current:   make([]float64, n),
		limits:    make([]map[uint32]span, n),
		firstSend: make([]atomic.Int64, n),
		errs:      map[string]int{},
		jobs:      make(chan job, backlog),
		stopped:   make(chan struct{}),
		done:      make(chan struct{}),
	}
	if l.request == nil {
		l.request = envoyRequest
	}
	nbins := int(opts.max/binWidth) + 2
	for i, d := range c.daemons {
		l.firstSend[i].Store(math.MaxInt64)
		l.bins[i] = make([]counts, nbins)
		l.limits[i] = map[uint32]span{}
		if d != nil {
			l.clients[i] = d.rls
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
		for n := int64(l.rate*el.Seconds()) - l.sent.Load(); n > 0; n-- {
			due := time.Duration(float64(seq) / l.rate * float64(time.Second))
			seq++
			l.sent.Add(1)
			slot, client := l.pick()
			if client == nil {
				continue
			}
			select {
			case l.jobs <- job{slot, client, seq, due}:
			default:
				l.shed.Add(1)
			}
		}
	}
}

// pick chooses the next daemon by smooth weighted round robin (nginx's): it
// spreads requests in the exact proportions of the weights, interleaved.
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
	return best, l.clients[best]
}

// send makes request seq, due at the given time since the start, and counts
// its answer in the bin of its due time. Counting by due time rather than by
// the moment the request went out keeps the series true to the offered load
// when the client falls behind: a backlog sent late spends the tokens that
// accrued while it waited, and is counted where it was due.
func (l *load) send(j job) {
	slot, due := j.slot, j.due
	sentAt := time.Since(l.start)
	storeMin(&l.firstSend[slot], int64(sentAt))
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	resp, err := j.client.ShouldRateLimit(ctx, l.request(j.seq))
	cancel()
	answered := time.Since(l.start)
	storeMax(&l.lastAnswer, int64(answered))
	b := &l.bins[slot][min(int(due/binWidth), len(l.bins[slot])-1)]
	storeMax(&b.late, int64(answered-due))
	storeMax(&b.sendLate, int64(sentAt-due))
	if err != nil {
		b.errs.Add(1)
		st := status.Convert(err)
		l.mu.Lock()
		l.errs[fmt.Sprintf("%s: %s", st.Code(), st.Message())]++
		l.mu.Unlock()
		return
	}
	if resp.OverallCode == rlsv3.RateLimitResponse_OK {
		b.ok.Add(1)
	} else {
		b.over.Add(1)
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
		if !seen || due < s.first {
			s.first = due
		}
		s.last = max(s.last, due)
		l.limits[slot][rpu] = s
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

// setTarget points slot i at a new daemon (a restarted process) with weight w.
func (l *load) setTarget(i int, d *daemon, w float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.clients[i] = d.rls
	l.weights[i] = w
	clear(l.current)
}

// firstSent is when, since the start, slot i got its first request: its
// buckets were created, full, no earlier.
func (l *load) firstSent(i int) time.Duration { return time.Duration(l.firstSend[i].Load()) }

// lastAnswered is when, since the start, the last answer came: no decision
// of the run was made later.
func (l *load) lastAnswered() time.Duration { return time.Duration(l.lastAnswer.Load()) }

// elapsed is the time since the load started, on the scale of its bins.
func (l *load) elapsed() time.Duration { return time.Since(l.start) }

// sleepUntil sleeps until the load has run for at least d.
func (l *load) sleepUntil(d time.Duration) {
	if w := d - l.elapsed(); w > 0 {
		time.Sleep(w)
	}
}

// stop ends the load and waits for every request in flight. It is safe to
// call more than once, and from any goroutine.
func (l *load) stop() {
	l.stopOnce.Do(func() { close(l.stopped) })
	<-l.done
	l.workers.Wait()
}

// wait lets the load run to its end, then stops it.
func (l *load) wait() {
	<-l.done
	l.stop()
}

// window is a span of the load's time, in whole bins.
type window struct{ from, to time.Duration }

func (w window) String() string {
	return fmt.Sprintf("[%.1fs, %.1fs)", w.from.Seconds(), w.to.Seconds())
}

func (w window) seconds() float64 { return (w.to - w.from).Seconds() }

// onTimeBin reports whether every request due in bin b, to any daemon, was
// answered within onTime of falling due, and none failed. An empty bin (no
// request fell due) is on time.
func (l *load) onTimeBin(b int) bool {
	for s := range l.bins {
		if b < 0 || b >= len(l.bins[s]) {
			continue
		}
		c := &l.bins[s][b]
		if c.late.Load() > int64(onTime) || c.errs.Load() > 0 {
			return false
		}
	}
	return true
}

// stable returns the largest window within [from, to) whose edges the client
// and the daemons met on time: the bins on both sides of each edge were
// answered on time.
//
// Why: under load the buckets are empty, so the answers to the requests due
// in a window spend exactly the tokens that accrued over it, however the
// requests bunched up inside it (a bucket holds at least a second's worth of
// its share, so a stall shorter than that loses no token). Only a stall across an edge moves admissions
// from one side of it to the other. On a machine shared with other work (CI
// runs packages in parallel) such stalls happen; measuring between on-time
// edges keeps them out of the result without loosening the tolerance. The
// window may shrink to half its length; beyond that the test fails, saying the
// machine could not keep up.
func (l *load) stable(t *testing.T, from, to time.Duration) window {
	t.Helper()
	lo := int((from + binWidth - 1) / binWidth)
	hi := int(to / binWidth)
	want := hi - lo
	edge := func(i int) bool { return l.onTimeBin(i-1) && l.onTimeBin(i) }
	for lo < hi && !edge(lo) {
		lo++
	}
	for hi > lo && !edge(hi) {
		hi--
	}
	w := window{time.Duration(lo) * binWidth, time.Duration(hi) * binWidth}
	if 2*(hi-lo) < want {
		t.Errorf("measurement window %v: the load generator or the daemons fell more than %s behind at too many points (%s); the machine is too busy to measure a rate", w, onTime, l.lateness())
	}
	return w
}

// count sums the answers of the given slots (every slot when none is given)
// to the requests due in w.
func (l *load) count(w window, slots ...int) (ok, over, errs int64) {
	if len(slots) == 0 {
		for i := range l.bins {
			slots = append(slots, i)
		}
	}
	for _, s := range slots {
		for b := int(w.from / binWidth); b < int(w.to/binWidth) && b < len(l.bins[s]); b++ {
			ok += l.bins[s][b].ok.Load()
			over += l.bins[s][b].over.Load()
			errs += l.bins[s][b].errs.Load()
		}
	}
	return ok, over, errs
}

// admitted is the admitted requests per second of the given slots in w.
func (l *load) admitted(w window, slots ...int) float64 {
	ok, _, _ := l.count(w, slots...)
	return float64(ok) / w.seconds()
}

// offered is the requests per second sent to the given slots in w.
func (l *load) offered(w window, slots ...int) float64 {
	ok, over, errs := l.count(w, slots...)
	return float64(ok+over+errs) / w.seconds()
}

// totals sums every answer of the run, per slot.
func (l *load) totals(slot int) (ok, over, errs int64) {
	return l.count(window{0, time.Duration(len(l.bins[slot])) * binWidth}, slot)
}

// lateness describes how far behind the load ran: the latest request sent
// after its due time (the client's lag), the latest answer (the client's and
// the daemon's), and how many bins had an answer later than onTime.
func (l *load) lateness() string {
	var sent, answered int64
	late, used := 0, 0
	for b := range l.bins[0] {
		active := false
		for s := range l.bins {
			c := &l.bins[s][b]
			sent = max(sent, c.sendLate.Load())
			answered = max(answered, c.late.Load())
			active = active || c.ok.Load()+c.over.Load()+c.errs.Load() > 0
		}
		if active {
			used++
			if !l.onTimeBin(b) {
				late++
			}
		}
	}
	return fmt.Sprintf("latest send %s and latest answer %s after due, %d of %d bins answered later than %s",
		time.Duration(sent).Round(time.Millisecond), time.Duration(answered).Round(time.Millisecond), late, used, onTime)
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
	l.mu.Lock()
	defer l.mu.Unlock()
	var errs int64
	for i := range l.bins {
		_, _, e := l.totals(i)
		errs += e
	}
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

// worstWindow is the most any one-second window within [from, to), sliding
// by bin, admitted per second, among the windows whose edges were met on
// time (see stable); fewer than half of them measurable fails the test.
func (l *load) worstWindow(t *testing.T, from, to time.Duration) (float64, window) {
	t.Helper()
	const span = int(time.Second / binWidth)
	edge := func(b int) bool { return l.onTimeBin(b-1) && l.onTimeBin(b) }
	var worst float64
	var worstW window
	measured, windows := 0, 0
	for b := int(from / binWidth); b+span <= int(to/binWidth); b++ {
		windows++
		if !edge(b) || !edge(b+span) {
			continue
		}
		measured++
		w := window{time.Duration(b) * binWidth, time.Duration(b+span) * binWidth}
		if r := l.admitted(w); r > worst {
			worst, worstW = r, w
		}
	}
	t.Logf("%d of %d one-second windows in [%v, %v) had on-time edges; load: %s", measured, windows, from, to, l.lateness())
	if 2*measured < windows {
		t.Errorf("only %d of %d windows could be measured: the machine is too busy to measure a rate", measured, windows)
	}
	return worst, worstW
}
