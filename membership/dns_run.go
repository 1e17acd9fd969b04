package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"time"

	"github.com/sharelimit/sharelimit/internal/human"
)

// Run resolves the name every Interval until ctx is done, then returns
// nil. Errors never end it: the last view stands while it retries. It
// returns ErrDNSRunning if called again while, or after, it runs.
func (s *DNS) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return ErrDNSRunning
	}
	if s.cfg.Server == "" && strings.HasSuffix(strings.TrimSuffix(s.cfg.Name, "."), ".consul") {
		s.log.Warn("dns membership: a .consul name through the system resolver: Consul's DNS answers at most 3 records over UDP to a resolver that sends no EDNS0, and cuts longer answers without setting the truncated bit, so a larger service would be undercounted and every share too large; set --peers-dns-server to Consul's DNS address, which is asked over TCP",
			"name", s.cfg.Name)
	}
	for {
		lctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
		addrs, err := s.lookup(lctx, s.cfg.Name)
		cancel()
		if ctx.Err() != nil {
			return nil
		}
		if !s.wait(ctx, s.observe(ctx, addrs, err)) {
			return nil
		}
	}
}

// observe publishes what one resolution gave and returns how long to wait
// before the next: Interval after an answer, a back-off after a failure.
func (s *DNS) observe(ctx context.Context, addrs []netip.Addr, err error) time.Duration {
	listed := distinctAddrs(addrs)
	if err == nil && len(listed) == 0 {
		err = ErrNoRecords
	}
	now := s.now()
	if err == nil && !s.answered && len(listed) < s.expect && now.Sub(s.started) < panicGraces*s.cfg.Grace {
		// A replica that starts remembers no address: were this answer
		// the truth, a server still partial (a Consul restarted empty,
		// re-registering) would give its first view, and it would take a
		// share its peers, who remember more, never left it. An answer
		// short of the view the state file saved is suspect, for as long
		// as the panic threshold holds the memory of the others.
		err = fmt.Errorf("%d addresses, fewer than the %d replicas of the view the state file saved: %w; the last view stands",
			len(listed), s.expect, ErrSuspect)
		s.fail(ctx, err, s.cfg.Interval)
		return s.cfg.Interval
	}
	if err != nil {
		var de *net.DNSError
		if errors.As(err, &de) && de.IsNotFound {
			err = fmt.Errorf("%w: %w", ErrNoRecords, err)
		}
		// Half fixed, so that a run of small random draws cannot turn the
		// back-off into a busy loop; half random, so that replicas that
		// failed together do not retry together.
		d := backoff(s.failures, s.cfg.BackoffBase, s.cfg.BackoffMax, 0.5+s.random()/2)
		s.failures++
		s.fail(ctx, err, d)
		return d
	}
	s.failures = 0
	s.refreshOwn(ctx)
	prev := s.view.Load()
	wasSelf := s.self
	n, local, selfCounted := s.count(listed, now)
	// n >= 1, and local is 0 or 1: a possible count.
	w, _ := Weight(local, n)
	v := &View{Source: "dns", Name: s.cfg.Name, Total: n, Local: local, TotalWeight: n, LocalWeight: local, Weight: w,
		ObservedAt: now, Errors: prev.Errors}
	switch {
	case local == 0:
		v.Fault = FaultAbsent
	case len(s.cfg.UpstreamBy) > 0 && !selfCounted && !s.self:
		v.Fault = FaultUnshared
	}
	first := !s.answered
	s.answered = true
	s.publish(v)
	if prev.LastError != "" {
		s.log.Info("dns membership: the name resolves again", "name", s.cfg.Name, "errors", v.Errors)
	}
	s.logSelf(v, prev, wasSelf)
	if !first && prev.Total == v.Total && prev.Local == v.Local {
		s.log.Debug("dns membership: view confirmed", "name", s.cfg.Name, "total", n, "listed", len(listed))
	} else {
		args := []any{"name", s.cfg.Name, "total", n, "local", local, "weight", w, "listed", len(listed)}
		if !first {
			args = append(args, "previous_total", prev.Total)
		}
		s.log.Info("dns membership: view changed", args...)
	}
	return s.cfg.Interval
}

// count takes an answer's addresses at now and returns the replicas it
// counts: every address listed, and every address listed within the grace
// (ten graces while the answer lists fewer than half of those
// remembered, but never for this host's own addresses); local, 1 unless
// this replica knows it is listed and none of its host's addresses counts;
// and whether one of them counts. An answer
// that lists one of its host's addresses tells it that it is listed.
func (s *DNS) count(listed map[netip.Addr]struct{}, now time.Time) (n, local int, selfCounted bool) {
	for a := range listed {
		s.seen[a] = now
		if _, ok := s.own[a]; ok {
			s.self = true
		}
	}
	grace := s.cfg.Grace
	if 2*len(listed) < len(s.seen) {
		grace *= panicGraces
	}
	for a, last := range s.seen {
		_, mine := s.own[a]
		g := grace
		if mine {
			// Never ten graces for this host's own addresses: whether an
			// answer is short of half the memory is each replica's own
			// judgment, and a peer that does not judge so drops this
			// replica one grace after its last answer listing it. This
			// replica must know it is absent by then; out of its own
			// count, it only gets tighter.
			g = s.cfg.Grace
		}
		if _, ok := listed[a]; !ok && now.Sub(last) >= g {
			delete(s.seen, a)
			continue
		}
		n++
		if mine {
			selfCounted = true
		}
	}
	local = 1
	if s.self && !selfCounted {
		local = 0
	}
	return n, local, selfCounted
}

// onlyAddr is the address counted, when one is; "" otherwise.
func (s *DNS) onlyAddr() string {
	for a := range s.seen {
		if len(s.seen) == 1 {
			return a.String()
		}
	}
	return ""
}

// logSelf says what an answer told this replica about itself: that it is
// listed (the first time, and again after it was absent), that it is
// absent (a warning when that begins), that it assumes it is listed (once),
// and that one address not its own is likely no headless Service's (a
// warning when that begins). wasSelf is whether it knew it was listed
// before the answer.
func (s *DNS) logSelf(v, prev *View, wasSelf bool) {
	switch {
	case v.Local == 0:
		if prev.Local != 0 {
			s.log.Warn("dns membership: the name no longer lists this host's address, for longer than --membership-grace: its peers no longer count this replica and leave it no share, so it admits next to nothing (one token per bucket) until it is listed again",
				"name", s.cfg.Name, "total", v.Total, "grace", s.cfg.Grace, "fault", FaultAbsent)
		}
	case prev.Local == 0:
		s.log.Info("dns membership: this host's address is listed again: this replica counts itself in again", "name", s.cfg.Name, "total", v.Total)
	case s.self && !wasSelf:
		s.log.Info("dns membership: this host's address is listed: from now on, an answer that no longer lists it, for longer than --membership-grace, makes this replica absent",
			"name", s.cfg.Name)
	case !s.self && !s.assumed:
		s.log.Info("dns membership: none of this host's addresses is listed, so this replica assumes it is listed under another (a Consul service address on another interface, a NATed address) or soon will be: it counts itself in, and cannot tell when it is not listed",
			"name", s.cfg.Name, "total", v.Total)
		s.assumed = true
	}
	if v.Fault != FaultUnshared {
		s.unsharedWarned = false
		return
	}
	if !s.unsharedWarned {
		s.unsharedWarned = true
		s.log.Warn("dns membership: the name resolves to none of this host's addresses, so its count is not the replicas' (with one address, every replica enforces every limit whole). This is upstream's deployment ("+human.Names(s.cfg.UpstreamBy)+
			"), and the name is likely a ClusterIP Service's or a load balancer's address rather than the replicas': name a headless Service (clusterIP: None) selecting the replicas, or tasks.<service> in Docker swarm",
			"name", s.cfg.Name, "address", s.onlyAddr(), "fault", FaultUnshared)
	}
}

// fail publishes a failure: the view stands, and only LastError, Errors and
// Fault change. The fault is logged at warn when it begins.
func (s *DNS) fail(ctx context.Context, err error, retryIn time.Duration) {
	prev := s.view.Load()
	v := *prev
	v.LastError = scrubLen(err.Error())
	v.Errors++
	switch {
	case errors.Is(err, ErrNoRecords):
		v.Fault = FaultNonePassing
	case errors.Is(err, ErrSuspect):
		v.Fault = FaultSuspect
	default:
		v.Fault = FaultError
	}
	s.publish(&v)
	level := slog.LevelDebug
	if v.Fault != prev.Fault {
		level = slog.LevelWarn
	}
	msg := "dns membership: resolution failed; the last view stands"
	if v.Fault == FaultSuspect {
		msg = "dns membership: a first answer short of the saved view is suspect; the saved view stands"
	}
	s.log.Log(ctx, level, msg,
		"name", s.cfg.Name, "error", v.LastError, "fault", v.Fault, "errors", v.Errors, "retry_in", retryIn.Round(time.Millisecond),
		"total", v.Total, "weight", v.Weight)
}

func (s *DNS) publish(v *View) {
	s.view.Store(v)
	if s.cfg.OnUpdate != nil {
		s.cfg.OnUpdate(*v)
	}
}
