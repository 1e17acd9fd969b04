// Package bucket is the token-bucket arithmetic and the store of live buckets.
//
// A bucket enforces one replica's share of a cluster-wide limit. Its state is kept
// as a fill ratio (tokens ÷ local size) rather than a token count, so a change of
// weight keeps the ratio by construction: the spec asks that a re-division neither
// hands out a fresh burst nor empties a bucket. Time is always passed in as
// nanoseconds on a caller-chosen monotonic scale; nothing here reads a clock.
//
// Why a package of its own: the admission bound is the product's promise, and
// here it is held by the arithmetic and the store alone, under concurrency, by
// model tests (model_test.go, store_model_test.go) that know nothing of rules,
// requests or the network. It knows no rules: a bucket is a key, a group, a
// tag and the figures it is handed.
//
// It must never read a clock, create tokens (a reading older than a bucket's
// last counts as the last, and a re-division keeps the fill ratio), or admit
// more than B·w + R·w·elapsed to any bucket.
package bucket

import (
	"math"
	"time"
)

// Params are a limit's cluster-wide figures. The zero value blocks everything.
// Params are immutable once built and are shared by every bucket of a rule.
type Params struct {
	// Rate is the cluster-wide refill rate R in tokens per second.
	Rate float64
	// Size is the cluster-wide bucket size B (the burst) in tokens.
	Size float64
	// MaxWait, when positive, makes a draw on an empty bucket reserve its tokens
	// and wait for them, up to this long (policy: wait).
	MaxWait time.Duration
}

// Blocked reports whether the limit admits nothing (requests_per_unit: 0).
// Such a limit stays blocked on every replica: it gets no floor of one token.
func (p *Params) Blocked() bool { return p.Rate <= 0 || p.Size <= 0 }

// Local returns the replica's rate (tokens/s) and size with weight w. The size is
// floored at one token so every replica can pass at least one request.
func (p *Params) Local(w float64) (rate, size float64) {
	if p.Blocked() {
		return 0, 0
	}
	return p.Rate * w, math.Max(p.Size*w, 1)
}

// Slower returns figures that refill a bucket no faster than either a or b
// does, at any weight, and no slower than both: a bucket gains
// R·w ÷ max(B·w, 1) = min(R·w, R/B) of its size a second, so the smaller
// rate with the smaller R/B gives exactly the lesser of the two at every w.
// A bucket that lived under a and then under b, switching at a time it did
// not record (a reload changed its rule's limit), has refilled no more than
// it would have at Slower(a, b) all along: never looser than the truth.
// With either blocked, so is the result: no refill at all.
func Slower(a, b *Params) Params {
	if a.Blocked() || b.Blocked() {
		return Params{}
	}
	rate := min(a.Rate, b.Rate)
	return Params{Rate: rate, Size: rate / min(a.Rate/a.Size, b.Rate/b.Size)}
}

// BurstTime is B ÷ R, how long a bucket of p takes to fill from empty at
// any weight without the one-token floor (with it, longer); 0 when p
// blocks. It is capped at maxBurstTime, a century, so the figure always
// fits a time.Duration.
func (p *Params) BurstTime() time.Duration {
	if p.Blocked() {
		return 0
	}
	s := p.Size / p.Rate
	if !(s < maxBurstTime.Seconds()) {
		return maxBurstTime
	}
	return time.Duration(s * float64(time.Second))
}

const maxBurstTime = 100 * 365 * 24 * time.Hour

// ratioPerNano is how much of the bucket refills per nanosecond at weight w.
func (p *Params) ratioPerNano(w float64) float64 {
	r, b := p.Local(w)
	if b == 0 {
		return 0
	}
	return r / b / 1e9
}

// Weight is one epoch of this replica's share. A new epoch starts on every change;
// the previous epochs are kept (a few) so a bucket untouched across a change can
// be brought up to the change at the old rate before switching.
// A Weight is immutable and safe for concurrent use.
type Weight struct {
	W     float64 // the share, in (0, 1]
	Epoch uint32
	Since int64 // when this epoch began, on the store's clock
	prev  *Weight
	// minW is the smallest W of this epoch and every one before it, trimmed
	// ones included: the rate a bucket from a trimmed epoch is refilled at for
	// the time nobody remembers, so the guess is never looser than the truth.
	minW float64
}

// keptEpochs bounds the history a Weight keeps. A bucket idle across more changes
// than this is refilled at the oldest kept rate for the time before them: buckets
// idle that long are almost always full already.
const keptEpochs = 8

// InitialWeight is the first epoch, valid from the beginning of time.
func InitialWeight(w float64) *Weight { return &Weight{W: w, Since: math.MinInt64, minW: w} }

// Next returns the epoch that follows wt, starting at now with share w. The
// history is copied, not shared, so readers of older epochs never see a change,
// and it is cut at keptEpochs so memory stays bounded however often the count
// changes.
func (wt *Weight) Next(w float64, now int64) *Weight {
	var chain [keptEpochs - 1]*Weight
	n := 0
	for x := wt; x != nil && n < len(chain); x = x.prev {
		chain[n] = x
		n++
	}
	var prev *Weight
	for i := n - 1; i >= 0; i-- {
		cp := *chain[i]
		cp.prev = prev
		prev = &cp
	}
	return &Weight{W: w, Epoch: wt.Epoch + 1, Since: now, prev: prev, minW: min(w, wt.minW)}
}

// State is one bucket. Fill is tokens ÷ local size: 1 is full, and it goes below
// 0 only while wait-policy reservations are outstanding. Last is when Fill was
// last brought up to date. The zero value is not meaningful; use Full.
type State struct {
	Fill  float64
	Last  int64
	Epoch uint32
	// group is the weight history the bucket lives by, as a Store keeps it
	// (Request.Group): the sweeper judges it by that group's weight, never
	// another's. It sits in padding, so it costs no memory.
	group uint16
	// tag names the rule the bucket belongs to (Request.Tag), so a snapshot
	// restored under another config can drop the buckets of rules that are
	// gone. It sits in padding too.
	tag uint16
}

// Full returns a bucket that starts full at now.
func Full(now int64, wt *Weight) State { return State{Fill: 1, Last: now, Epoch: wt.Epoch} }

// advance refills s up to now, lazily, at the rate of each weight epoch it lived
// through. The clock is monotonic, so a reading older than Last can only mean
// that two callers reached the bucket out of order (each read the clock before
// taking the lock). Such a reading counts as Last: moving Last back would make
// the next reading refill the gap a second time (golang/go#56287 is the same
// bug in x/time/rate).
func (s *State) advance(p *Params, wt *Weight, now int64) {
	if now <= s.Last {
		return
	}
	if s.Epoch != wt.Epoch {
		// Collect the epochs that began after the bucket's own, newest first.
		var seg [keptEpochs]*Weight
		n := 0
		x := wt
		for ; x != nil && x.Epoch != s.Epoch && n < len(seg); x = x.prev {
			seg[n] = x
			n++
		}
		// The bucket's own epoch, if it is still kept. If not (trimmed, or a
		// reordered request brought an older history), the time before the
		// oldest kept epoch refills at the smallest weight ever seen up to
		// it: under the one-token floor a smaller weight refills slower, so
		// this errs tighter, never looser.
		oldW := seg[n-1].minW
		if x != nil && x.Epoch == s.Epoch {
			oldW = x.W
		}
		for i := n - 1; i >= 0; i-- {
			if seg[i].Since > s.Last && seg[i].Since < now {
				s.fill(p, oldW, seg[i].Since-s.Last)
				s.Last = seg[i].Since
			}
			oldW = seg[i].W
		}
		s.Epoch = wt.Epoch
	}
	s.fill(p, wt.W, now-s.Last)
	s.Last = now
}

func (s *State) fill(p *Params, w float64, dt int64) {
	if s.Fill >= 1 || dt <= 0 {
		return
	}
	s.Fill = min(1, s.Fill+float64(dt)*p.ratioPerNano(w))
}

// Do brings s up to now at the rates of the weight epochs it lived through,
// then runs op for n tokens at wt's share. It is the only way to change a
// bucket: the refill and the draw happen in one call, in that order, as in
// x/time/rate's reserveN(t, n, maxFutureReserve).
func (s *State) Do(p *Params, wt *Weight, now int64, op Op, n float64) Result {
	s.advance(p, wt, now)
	return s.apply(p, wt.W, op, n)
}

// Op says what a request does to a bucket.
type Op uint8

const (
	// Draw takes n tokens, or fails and takes nothing.
	Draw Op = iota
	// Check takes nothing and reports whether one more request would pass now.
	Check
	// GiveBack returns n tokens (Envoy's is_negative_hits), up to a full bucket.
	GiveBack
)

// Result is the outcome of one operation on one bucket.
type Result struct {
	OK bool
	// Tokens is what the bucket holds locally after the operation.
	Tokens float64
	// Size is the bucket's local size at the current weight.
	Size float64
	// Wait is how long the caller must hold the answer until reserved tokens
	// exist (policy: wait). Zero otherwise.
	Wait time.Duration
	// Reset is the time until the bucket is full again on success, or until
	// enough tokens for this request exist on failure.
	Reset time.Duration
}

// epsilon absorbs float rounding so that n draws of 1/n of a bucket all succeed.
const epsilon = 1e-9

// apply runs op for n tokens on s, already advanced to now, at weight w.
func (s *State) apply(p *Params, w float64, op Op, n float64) Result {
	rate, size := p.Local(w)
	if size == 0 {
		// requests_per_unit: 0 blocks every request, check-only included.
		return Result{OK: op == GiveBack, Reset: 0}
	}
	tokens := s.Fill * size
	res := Result{Size: size}
	switch op {
	case GiveBack:
		tokens = min(size, tokens+n)
		res.OK = true
	case Check:
		res.OK = tokens+epsilon >= 1
		if !res.OK {
			res.Reset = secs((1 - tokens) / rate)
		}
	case Draw:
		switch {
		case n > size+epsilon:
			// No amount of waiting fills a bucket past its size: OVER_LIMIT now,
			// as x/time/rate refuses n > burst, and nothing is reserved.
			res.Reset = secs((n - tokens) / rate)
		case tokens+epsilon >= n:
			tokens -= n
			res.OK = true
		case p.MaxWait > 0 && rate > 0 && (n-tokens)/rate <= p.MaxWait.Seconds():
			res.Wait = secs((n - tokens) / rate)
			tokens -= n
			res.OK = true
		default:
			res.Reset = secs((n - tokens) / rate)
		}
	}
	if tokens < 0 && tokens > -epsilon && res.Wait == 0 {
		tokens = 0
	}
	s.Fill = tokens / size
	res.Tokens = tokens
	if res.OK {
		res.Reset = secs((size - tokens) / rate)
	}
	return res
}

func secs(s float64) time.Duration {
	if s <= 0 || math.IsNaN(s) {
		return 0
	}
	if s >= float64(math.MaxInt64/int64(time.Second)) {
		return math.MaxInt64
	}
	return time.Duration(s * float64(time.Second))
}

// FullAt reports whether s will have refilled completely by now at weight wt:
// such a bucket carries no information and can be dropped losslessly.
func (s State) FullAt(p *Params, wt *Weight, now int64) bool {
	if p.Blocked() {
		return true // a blocked limit has no state worth keeping
	}
	s.advance(p, wt, now)
	return s.Fill >= 1
}
