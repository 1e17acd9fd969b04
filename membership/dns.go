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
	"sync/atomic"
	"time"
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
