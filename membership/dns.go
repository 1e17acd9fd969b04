package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sharelimit/sharelimit/internal/human"
)

// Defaults for the zero fields of DNSConfig.
const (
	// DefaultDNSInterval is how often the name is resolved again
	// (--peers-dns-interval): a scale-up reaches every replica's share
	// within about this long, and a thousand replicas cost the DNS server
	// 200 lookups a second.
	DefaultDNSInterval = 5 * time.Second
	// DefaultDNSTimeout bounds one resolution, A and AAAA together, so a
	// server that never answers cannot wedge the loop.
	DefaultDNSTimeout = 5 * time.Second
	// DefaultDNSBackoffBase and DefaultDNSBackoffMax shape the wait after a
	// failed resolution: half fixed, half random, over an exponential
	// ceiling (1 s, 2 s, 4 s, ..., 30 s), reset by the next answer.
	DefaultDNSBackoffBase = time.Second
	DefaultDNSBackoffMax  = 30 * time.Second
)

// ErrDNSRunning is returned by a second call of DNS.Run.
var ErrDNSRunning = errors.New("run dns membership: already running")

// ErrNoRecords marks an answer with no A or AAAA record: NXDOMAIN, or a name
// that exists with no address. Consul's DNS answers so when no instance of
// the service passes, Kubernetes when no pod of a headless Service is ready,
// and every server when the name is mistyped. The last view stands.
var ErrNoRecords = errors.New("no A or AAAA record")

// DNSConfig configures a DNS source. The zero value of every field but Name
// is usable.
type DNSConfig struct {
	// Name is resolved for its A and AAAA records (--peers-dns). The
	// system resolver applies its search list to a name with fewer dots
	// than its ndots (Kubernetes sets 5); a name ending in "." skips it.
	Name string
	// Server, host:port, is asked over TCP instead of the system resolver
	// (--peers-dns-server). TCP, because a DNS server may cut a UDP answer
	// short without saying so: Consul's answers at most 3 records over UDP
	// to a client that sends no EDNS0 (dns_config.udp_answer_limit), and
	// as many as fit in the client's EDNS0 size to one that does, with the
	// truncated bit unset unless dns_config.enable_truncate is on. Over TCP
	// it answers up to 4096 records.
	Server string
	// Interval is the wait between two resolutions that answered
	// (--peers-dns-interval). Default DefaultDNSInterval.
	Interval time.Duration
	// Timeout bounds one resolution. Default DefaultDNSTimeout.
	Timeout time.Duration
	// Replicas is the count that stands until the first answer
	// (--replicas); below 1 means 1.
	Replicas int
	// Initial, when set, is the view that stands until the first answer
	// instead of the Replicas one: the view a restarted daemon saved
	// (--state-file), so that it does not enforce a whole limit while the
	// name does not resolve. Until an answer has been believed, one that
	// lists fewer addresses than it counted replicas is suspect
	// (FaultSuspect) and the view stands, for up to ten graces after Run
	// starts, as the Consul source holds its first answers. One that is
	// not a possible DNS view is ignored. One with Local 0 says that this
	// replica had seen its host's address listed and knew it was absent:
	// it stays absent until an answer lists one of its addresses again.
	Initial *View
	// Grace is how long an address still counts after the last answer
	// that listed it (--membership-grace), as the Consul source counts an
	// instance for the grace after it last passed: a DNS server drops a
	// replica from its answers the moment its check fails (Consul) or it
	// is not ready (Kubernetes), while the replica may go on serving. An
	// answer listing fewer than half of the addresses remembered keeps
	// them counted for ten graces. 0 means DefaultGrace; a negative grace
	// counts only the addresses of the last answer.
	Grace time.Duration
	// UpstreamBy, when set, says that the deployment is
	// envoyproxy/ratelimit's, whose replicas shared one count in Redis,
	// and names what made it so. There a replica is listed under its own
	// address (a pod's, a container's), so an answer that lists none of
	// this host's addresses, from a replica that has never seen one
	// listed, is FaultUnshared, with a warning: most likely the name is a
	// ClusterIP Service's (one address, or two when dual-stack) or a load
	// balancer's, not a headless Service's, and the count says nothing of
	// the replicas: with one address, every replica enforces every limit
	// whole.
	UpstreamBy []string
	// BackoffBase and BackoffMax shape the wait after the n-th failure in a
	// row: a random duration in [c/2, c), c = min(BackoffMax,
	// BackoffBase·2^(n-1)). Defaults DefaultDNSBackoffBase and
	// DefaultDNSBackoffMax.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// Logger receives count changes at info, the start of a fault at warn,
	// and every resolution at debug. The caller tags it. nil discards.
	Logger *slog.Logger
	// OnUpdate, if set, receives every published View, from Run's
	// goroutine: after every resolution, answered or failed. It must
	// return quickly.
	OnUpdate func(View)
	// Clock stamps ObservedAt. nil means time.Now. The waits between
	// resolutions use real timers.
	Clock func() time.Time
}

// DNS is a membership source that counts the addresses a DNS name resolves
// to: the A and AAAA records of a Kubernetes headless Service (one per ready
// pod), of Consul's <service>.service.consul (one per instance not failing
// its checks), or of a compose service (one per container). It needs no
// Consul client, no Kubernetes API access and no RBAC.
//
// Each distinct address is one replica: Total is their count, Local is 1
// (0 when this replica knows it is absent, below), and the weight is
// 1/Total. Replicas that share an address (two on one host, told apart only
// by port) count once, and would each take the share of one: give each
// replica its own address. A replica listed under two addresses (a
// dual-stack pod, with an A and an AAAA record) counts twice, which makes
// every share smaller: tighter, never looser. An address counts from the
// answer that lists it until Grace after the last answer that listed it,
// as the Consul source counts an instance.
//
// Whether this replica is among the addresses can be known only when it is
// listed under one of its own host's addresses (a pod's IP, a container's,
// a host's with host networking): the address a replica is listed under is
// whatever its Service, registration or network gave it (a Consul service
// address on another interface, a NATed or overlay address). So a replica
// that has seen one of its host's addresses in an answer knows it is
// listed, and once an answer no longer counts any of them (after the
// grace), it is absent: its peers no longer count it, and it takes
// AbsentWeight with FaultAbsent, as the Consul source does. A replica that
// has never seen one assumes it is listed. So a replica not yet listed (a
// Kubernetes pod before it is ready, unless its Service sets
// publishNotReadyAddresses) takes 1/Total, a share its peers do not leave
// it: if it serves then, the cluster may admit up to (Total+1)/Total of
// each limit. A replica is safe to serve once it is listed and every peer
// has resolved the name since (one Interval, plus the record's TTL in any
// cache between).
//
// The source follows the rules of the others. It resolves in the
// background, never on the request path. Until the first answer, the
// --replicas view, or the Initial one, stands. An error, or an answer
// with no address, is a fault: the last view stands (never a count of 0),
// with LastError, Errors and Fault set and a warning when the fault
// begins, and the next try backs off. A resolution whose A or AAAA query
// failed (anything but a name or type with no record) is such an error:
// the family that answered is not the count. A Damper in front of it
// applies a count that grows (a share that shrinks) at once, and holds one
// that falls, for its hold plus PeersLag.
//
// View is safe for concurrent use and never blocks. Run must be called
// once, by the owner of the source. DNS has no useful zero value; use
// NewDNS.
type DNS struct {
	cfg     DNSConfig
	log     *slog.Logger
	now     func() time.Time
	view    atomic.Pointer[View]
	running atomic.Bool

	// lookup resolves a name to its addresses. Tests swap it, before
	// Run, for a resolver giving what no real server can.
	lookup func(ctx context.Context, name string) ([]netip.Addr, error)
	// wait sleeps d or until ctx is done, reporting whether the full wait
	// elapsed; random is uniform in [0, 1). Tests swap them, before Run,
	// to run the loop without sleeping.
	wait   func(ctx context.Context, d time.Duration) bool
	random func() float64
	// localAddrs lists this host's addresses (net.InterfaceAddrs). Tests
	// swap it, before Run.
	localAddrs func() ([]netip.Addr, error)

	// Only Run's goroutine touches these.
	answered bool
	failures int // in a row, since the last answer
	// seen is every address counted, and when an answer last listed it.
	seen map[netip.Addr]time.Time
	// own are this host's addresses, as last listed by localAddrs.
	own map[netip.Addr]struct{}
	// self: an answer has listed one of own, so this replica knows it is
	// listed; assumed: it never has, and has said so. unsharedWarned: the
	// warning of FaultUnshared was logged since an answer without it.
	self, assumed, unsharedWarned bool
	// expect is the replica count of the Initial view (0 without one):
	// first answers are held to it from started on.
	expect  int
	started time.Time
}

// NewDNS returns a DNS source. It starts with the Initial view, or else
// the Replicas one, and resolves nothing until Run.
func NewDNS(cfg DNSConfig) (*DNS, error) {
	if err := cfg.normalize(); err != nil {
		return nil, fmt.Errorf("new dns membership source: %w", err)
	}
	s := &DNS{cfg: cfg, log: cfg.Logger, now: cfg.Clock, wait: sleep, random: rand.Float64, localAddrs: interfaceAddrs,
		seen: map[netip.Addr]time.Time{}, own: map[netip.Addr]struct{}{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.started = s.now()
	s.lookup = resolver(cfg.Server).lookup
	v := replicasView("dns", cfg.Replicas)
	if in := cfg.Initial; in != nil {
		// A DNS view weighs every replica 1, and counts itself or not.
		if w, err := Weight(in.Local, in.Total); err == nil && in.Local <= 1 && w == in.Weight &&
			in.TotalWeight == in.Total && in.LocalWeight == in.Local {
			v = View{Source: "dns", Total: in.Total, Local: in.Local, TotalWeight: in.Total, LocalWeight: in.Local, Weight: w}
			s.expect = in.Total
			// Absent before the restart: it had seen its host's address
			// listed, and knew when it no longer was. It stays absent
			// until an answer lists that address again.
			s.self = in.Local == 0
		}
	}
	v.Name = cfg.Name
	s.view.Store(&v)
	return s, nil
}

// normalize checks cfg and fills in defaults, reporting every problem at once.
func (cfg *DNSConfig) normalize() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if strings.TrimSuffix(cfg.Name, ".") == "" {
		bad("dns name is empty")
	}
	if cfg.Server != "" {
		if host, port, err := net.SplitHostPort(cfg.Server); err != nil || host == "" || port == "" {
			bad("dns server %q is not host:port", cfg.Server)
		}
	}
	if cfg.Interval < 0 || cfg.Timeout < 0 {
		bad("interval %s or timeout %s is negative", cfg.Interval, cfg.Timeout)
	}
	if cfg.BackoffBase < 0 || cfg.BackoffMax < 0 {
		bad("back-off %s..%s is negative", cfg.BackoffBase, cfg.BackoffMax)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if cfg.Interval == 0 {
		cfg.Interval = DefaultDNSInterval
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultDNSTimeout
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = DefaultDNSBackoffBase
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = max(DefaultDNSBackoffMax, cfg.BackoffBase)
	}
	switch {
	case cfg.Grace == 0:
		cfg.Grace = DefaultGrace
	case cfg.Grace < 0:
		cfg.Grace = 0
	}
	if cfg.BackoffMax < cfg.BackoffBase {
		return fmt.Errorf("back-off max %s is below its base %s", cfg.BackoffMax, cfg.BackoffBase)
	}
	return nil
}

// resolver resolves through server over TCP, or through the system's
// nameservers when server is "".
type resolver string

// lookup returns the A and AAAA records of name, asked for separately: a
// family with no record (NXDOMAIN or NODATA for its type) is empty, and
// any other failure of either (SERVFAIL, REFUSED, no answer in time, a
// garbled answer) fails the whole lookup. Go's resolver, asked for "ip",
// returns the family that answered and drops the other's error, and a
// count of half the replicas would double every share. StrictErrors makes
// a temporary failure of any name tried on the search list fail the
// family, rather than be passed over for a later name's "not found". An
// IP address given as the name is its one address.
func (server resolver) lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(name); err == nil {
		return []netip.Addr{a}, nil
	}
	// The Go resolver, whichever the platform's default: StrictErrors is
	// its alone, and the binary is built without cgo anyway.
	r := &net.Resolver{PreferGo: true, StrictErrors: true}
	if server != "" {
		// Every query (to whichever nameserver resolv.conf lists) is
		// sent to server over TCP: a stream answer is never cut to fit
		// a datagram.
		r.Dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", string(server))
		}
	}
	var v4, v6 []netip.Addr
	var err4, err6 error
	var wg sync.WaitGroup
	wg.Go(func() { v4, err4 = r.LookupNetIP(ctx, "ip4", name) })
	v6, err6 = r.LookupNetIP(ctx, "ip6", name)
	wg.Wait()
	for _, err := range []error{err4, err6} {
		if de := (*net.DNSError)(nil); server != "" && errors.As(err, &de) {
			// The error names the nameserver resolv.conf lists, which
			// was never asked.
			de.Server = string(server)
		}
	}
	empty4, empty6 := notFound(err4), notFound(err6)
	switch {
	case err4 != nil && !empty4:
		return nil, fmt.Errorf("A records: %w", err4)
	case err6 != nil && !empty6:
		return nil, fmt.Errorf("AAAA records: %w", err6)
	case empty4 && empty6:
		return nil, err4
	}
	return append(v4, v6...), nil
}

// notFound reports whether err says that the name has no record of the
// type asked: NXDOMAIN or NODATA, or an address in /etc/hosts of the other
// family only.
func notFound(err error) bool {
	var de *net.DNSError
	var ae *net.AddrError
	return errors.As(err, &de) && de.IsNotFound || errors.As(err, &ae) && ae.Err == "no suitable address found"
}

// interfaceAddrs lists the addresses of this host's interfaces.
func interfaceAddrs() ([]netip.Addr, error) {
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(ifaddrs))
	for _, ia := range ifaddrs {
		if n, ok := ia.(*net.IPNet); ok {
			if a, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

// View returns the current view. It never blocks and is safe for concurrent
// use.
func (s *DNS) View() View { return *s.view.Load() }

// PeersLag is how much later than this replica a peer may see a change of
// the answer, and the DamperConfig.PeersLag of a Damper in front of s: one
// Interval plus one Timeout. Each replica resolves on its own phase, so a
// peer's last answer listing a replica may come up to one Interval (and a
// lookup's Timeout) before that replica's own. A peer then drops a
// delisted replica, a grace after its last answer listing it, up to
// PeersLag before the replica itself, a grace after its own, knows it is
// absent; and a replica listed again counts itself up to PeersLag before
// its peers count it. Holding every grow for --membership-hold +
// PeersLag (rather than letting a replica's own address expire PeersLag
// early, which leaves the second case open) keeps the sum of the weights
// in force at most 1 in both, as long as peers resolve on their Interval;
// a DNS cache's TTL, and a resolver that fails and backs off, add their
// own lag, which this does not cover.
func (s *DNS) PeersLag() time.Duration { return s.cfg.Interval + s.cfg.Timeout }

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

// refreshOwn lists this host's addresses again; on an error the last list
// stands.
func (s *DNS) refreshOwn(ctx context.Context) {
	addrs, err := s.localAddrs()
	if err != nil {
		s.log.Log(ctx, slog.LevelDebug, "dns membership: this host's addresses not listed; the last list stands", "error", err)
		return
	}
	clear(s.own)
	for _, a := range addrs {
		if a.IsValid() && !a.IsUnspecified() {
			s.own[a.Unmap().WithZone("")] = struct{}{}
		}
	}
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

// countAddrs is how many distinct addresses addrs holds; an IPv4 address
// and its IPv4-mapped IPv6 form are one.
func countAddrs(addrs []netip.Addr) int { return len(distinctAddrs(addrs)) }

// distinctAddrs is the set of the valid addresses in addrs, each unmapped
// and without its zone.
func distinctAddrs(addrs []netip.Addr) map[netip.Addr]struct{} {
	seen := make(map[netip.Addr]struct{}, len(addrs))
	for _, a := range addrs {
		if a.IsValid() {
			seen[a.Unmap().WithZone("")] = struct{}{}
		}
	}
	return seen
}
