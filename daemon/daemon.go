// Package daemon assembles sharelimit's parts into the running daemon and owns
// their lifetimes: the engine and its buckets, the config source, the
// membership source, the gRPC and admin servers, the sweeper and the stop
// sequence. main parses settings and hands them to New; every goroutine the
// daemon needs is started by Run and has ended when Run returns.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/internal/gcpace"
	"github.com/sharelimit/sharelimit/internal/human"
	"github.com/sharelimit/sharelimit/internal/monotime"
	"github.com/sharelimit/sharelimit/membership"
	"github.com/sharelimit/sharelimit/server"
	"github.com/sharelimit/sharelimit/source"
	"github.com/sharelimit/sharelimit/source/xds"
	"github.com/sharelimit/sharelimit/state"
)

// ErrConfig marks an invalid config at start-up. The error New returns with
// it also holds every *descriptors.Error, for printing one per line.
var ErrConfig = errors.New("invalid config at start-up")

// Daemon is the assembled daemon. It is built by New and run once by Run.
type Daemon struct {
	cfg     *config.Config
	log     *slog.Logger
	clock   monotime.Clock
	engine  *descriptors.Engine
	watcher *source.Watcher // nil with rules from xDS
	xds     *xds.Source     // nil with rules from files
	views   views           // the default membership view first, then one per --domain-service service
	admin   *server.Admin
	health  *health.Server
	streams *server.StreamCloser
	grpc    server.GRPC
	http    *http.Server
	grpcLis net.Listener
	httpLis net.Listener
	// The debug listener (--debug-addr, upstream's DEBUG_PORT): upstream's
	// debug endpoints (server.Admin.DebugHandler); nil when not asked for.
	debug    *http.Server
	debugLis net.Listener
	// The loopback admin listener (--local-http-addr): every admin page,
	// beside an admin listener beyond loopback; nil when there is none.
	local    *http.Server
	localLis net.Listener
	// The metrics listener (--metrics-addr, upstream's PROMETHEUS_ADDR):
	// upstream's series and sharelimit's (metricsServer); nil when not
	// asked for.
	metricsSrv *http.Server
	metricsLis net.Listener
	// state is --state-file's keeper, nil without it; snap is the snapshot
	// read at start, until it is restored.
	state       *keeper
	snap        *state.Snapshot
	restoreOnce sync.Once
	started     time.Time
}

// New builds the daemon from cfg: it loads the rules (an invalid config is an
// error wrapping ErrConfig), sets up membership and opens both listeners. It
// starts no goroutine of its own; the gRPC server's stream workers, which
// grpc-go starts when it is built, end in Run's stop. A daemon that New
// returns must be Run. version names the build on the status page.
func New(cfg *config.Config, log *slog.Logger, version string) (*Daemon, error) {
	d := &Daemon{cfg: cfg, log: log, clock: monotime.New(), started: time.Now()}
	for _, l := range []struct{ name, addr string }{{"grpc", cfg.GRPCAddr}, {"http", cfg.HTTPAddr}, {"debug", cfg.DebugAddr}} {
		if strings.HasPrefix(l.addr, "unix:") {
			continue // a socket file: reached through the filesystem, not the network
		}
		if host, _, err := net.SplitHostPort(l.addr); err == nil && !config.IsLoopback(host) {
			log.Warn("listening on a non-loopback address: anything that can reach it can spend this node's limits", "listener", l.name, "addr", l.addr)
		}
	}
	store := bucket.NewStore(cfg.MaxBuckets)
	d.engine = descriptors.NewEngine(nil, 1/float64(cfg.Replicas), store)
	d.engine.SetQuotaMode(cfg.QuotaMode)
	metrics := server.NewMetrics(store)
	if cfg.MetricsAddr != "" {
		metrics.CountUpstream(cfg.NearLimitRatio) // before any rule is bound
	}
	if cfg.StateFile != "" {
		// Before membership and the rules: the saved seed keys the
		// buckets, and the saved views stand until Consul answers.
		d.state = newKeeper(d, metrics.Registry)
		d.snap = d.state.load(time.Now())
	}
	if err := d.membership(metrics.Registry); err != nil {
		return nil, err
	}
	var rules *installer
	var err error
	if cfg.ConfigType == config.ConfigXDS {
		rules = newInstaller(d.engine, metrics, "xds:"+cfg.XDSServerURL, log, d.clock)
		// The saved buckets go in with the first rules, before they are
		// installed: no request meets those rules with full buckets, even
		// when the daemon serves before xDS answers.
		rules.before = func(set *descriptors.Set) { d.restore(set) }
		err = d.xdsRules(rules, metrics.Registry)
	} else {
		rules = newInstaller(d.engine, metrics, cfg.ConfigDir, log, d.clock)
		err = d.loadRules(rules, metrics.Registry)
	}
	if err != nil {
		return nil, err
	}
	return d.finish(cfg, log, version, metrics, rules)
}

// finish builds what serves, whichever source the rules come from.
func (d *Daemon) finish(cfg *config.Config, log *slog.Logger, version string, metrics *server.Metrics, rules *installer) (*Daemon, error) {
	svc := server.NewService(d.engine, d.clock, metrics, server.Options{
		ShadowMode: cfg.ShadowMode, ResponseHeaders: cfg.ResponseHeaders,
		HeaderLimit: cfg.HeaderLimit, HeaderRemaining: cfg.HeaderRemaining, HeaderReset: cfg.HeaderReset,
		DynamicMetadata: cfg.ResponseDynamicMetadata,
	}, log.With("component", "grpc"))
	var tlsConfig *tls.Config
	if cfg.GRPCTLSCert != "" {
		var err error
		if tlsConfig, err = server.TLSConfig(cfg.GRPCTLSCert, cfg.GRPCTLSKey, cfg.GRPCTLSClientCA, cfg.GRPCTLSClientSAN); err != nil {
			return nil, err
		}
	}
	// A snapshot counts as restored state only if the replica was down for
	// less than the longest ramp: after longer, its buckets have refilled
	// as a newcomer's start, while its peers' are spent, and it ramps.
	restored := d.snap != nil && elapsed(d.snap, time.Now()) < rampHorizon(cfg.JoinRamp)
	if d.xds == nil {
		// Every bucket is back before a listener opens: nothing is served
		// with full buckets for keys still being restored. (Rules from
		// xDS restore as the first config is installed: see xdsRules.)
		d.restore(nil)
	}
	j := newJoiner(d.engine.Store(), d.clock, cfg.JoinRamp, d.views, restored)
	j.register(metrics.Registry)
	for _, v := range d.views {
		v.join.Store(j)
	}
	// Listen before building the gRPC server: grpc-go starts its stream
	// workers in NewServer, and a listener that fails must leave nothing
	// running behind it.
	if err := d.listen(); err != nil {
		return nil, err
	}
	d.health = server.NewHealth()
	d.streams = server.NewStreamCloser()
	if cfg.GRPCTransport == config.TransportDirect {
		d.grpc = server.NewDirectServer(svc, d.health, tlsConfig, log.With("component", "grpc"), d.streams.ServerOption())
	} else {
		d.grpc = server.NewGRPCServer(svc, d.health, tlsConfig, d.streams.ServerOption())
	}
	d.admin = server.NewAdmin(svc, d.engine, metrics, d.views.Admin, rules.Status)
	d.admin.SetVersion(version)
	// Ready unless health waits for a config with a domain in it (upstream's
	// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED); from now on every install
	// says again.
	d.setReady(d.readyWith(d.engine.Set()) && !d.waitsForXDS())
	rules.onInstall(func(set *descriptors.Set) { d.setReady(d.readyWith(set)); d.markReload(rules) })
	d.markMembership()
	admin := d.admin.Handler()
	if host, _, err := net.SplitHostPort(cfg.HTTPAddr); err == nil && !config.IsLoopback(host) {
		admin = d.admin.BeyondLoopback(cfg.LocalHTTPAddr) // as upstream's 8080: /healthcheck and /json
	}
	d.http = &http.Server{Handler: admin, ReadHeaderTimeout: 10 * time.Second}
	attrs := []any{"version", version, "grpc", d.grpcLis.Addr().String(), "http", d.httpLis.Addr().String()}
	if d.localLis != nil {
		d.local = &http.Server{Handler: d.admin.Handler(), ReadHeaderTimeout: 10 * time.Second}
		attrs = append(attrs, "local_http", d.localLis.Addr().String())
	}
	if d.debugLis != nil {
		d.debug = &http.Server{Handler: d.admin.DebugHandler(), ReadHeaderTimeout: 10 * time.Second}
		attrs = append(attrs, "debug", d.debugLis.Addr().String())
	}
	if d.metricsLis != nil {
		d.metricsSrv = d.metricsServer(metrics, rules)
		attrs = append(attrs, "metrics", d.metricsLis.Addr().String())
	}
	for _, v := range d.views {
		attrs = append(attrs, "membership", v.service+"="+strconv.FormatFloat(d.engine.GroupWeight(v.group).W, 'g', 6, 64))
	}
	log.Info("sharelimit serving", append(attrs, "max_buckets", cfg.MaxBuckets, "quota_mode", cfg.QuotaMode)...)
	return d, nil
}

// unshared reports whether cfg is upstream's deployment at --replicas 1; with
// a static view, that is a fault: upstream's replicas shared their counts,
// and these do not.
func unshared(cfg *config.Config) bool {
	return len(cfg.UpstreamBy) > 0 && cfg.Replicas == 1
}

// waitsForXDS reports whether serving waits for the management server's first
// good update: with rules from xDS, unless --force-start-without-initial-config
// says to serve with none meanwhile, as upstream.
func (d *Daemon) waitsForXDS() bool { return d.xds != nil && !d.cfg.ForceStart }

// readyWith reports whether health says SERVING with set in force: always,
// unless --healthy-with-at-least-one-config-loaded asks for a domain.
func (d *Daemon) readyWith(set *descriptors.Set) bool {
	return !d.cfg.HealthyWithConfig || len(set.Domains()) > 0
}

// setReady sets both health endpoints: /healthcheck and gRPC health. After
// the drain has begun, gRPC health stays NOT_SERVING whatever this says.
func (d *Daemon) setReady(ok bool) {
	d.admin.SetReady(ok)
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	for _, name := range server.HealthServices() {
		d.health.SetServingStatus(name, st)
	}
}

// loadRules loads the config dir once; from then on the watcher reloads it,
// and a bad config is a failed reload: logged, counted, the rules in force kept.
func (d *Daemon) loadRules(rules *installer, reg prometheus.Registerer) error {
	d.watcher = &source.Watcher{
		Dir: d.cfg.ConfigDir, Debounce: d.cfg.ReloadDebounce, Poll: source.DefaultPoll,
		Log: d.log.With("component", "reload"), Apply: rules.install,
		Options: source.Options{Compile: descriptors.CompileOptions{MergeDomains: d.cfg.MergeDomainConfig}, AllFiles: d.cfg.ConfigAllFiles},
	}
	// The watcher knows no metrics; the gauge reads it. A 1 means reloads wait
	// for the poll: on a node, usually fs.inotify.max_user_instances is spent.
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sharelimit_config_watch_polling",
		Help: "1 when fsnotify cannot watch the config dir and changes to it are seen only by polling; 0 otherwise.",
	}, func() float64 {
		if d.watcher.Polling() {
			return 1
		}
		return 0
	}))
	err := d.watcher.Load()
	d.watcher.Error = rules.reject
	if err != nil {
		if !d.cfg.ForceStart {
			return fmt.Errorf("%w: %w", ErrConfig, err)
		}
		// Upstream's FORCE_START_WITHOUT_INITIAL_CONFIG: serve with no rules
		// (every request OK) and load the directory as soon as it is valid.
		rules.reject(err)
		d.log.Warn("first config invalid; serving with no rules until it loads (--force-start-without-initial-config)")
	}
	return nil
}

// membership sets up one view per membership source: the default view, from
// --consul-service or else the static --replicas count, and one per service
// --domain-service names, each dividing its own domains' limits in an engine
// group of its own. A Consul view starts at the --replicas count and stands
// until Consul first answers; with --membership-hold, its changes pass
// through a damper, so that one that grows the share waits until it holds.
func (d *Daemon) membership(reg prometheus.Registerer) error {
	cfg := d.cfg
	byService := map[string][]string{}
	for _, m := range cfg.DomainServices {
		byService[m.Service] = append(byService[m.Service], m.Domain)
	}
	var client *api.Client
	var token string
	if cfg.ConsulService != "" || len(cfg.DomainServices) > 0 {
		ccfg := api.DefaultConfig() // CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, CONSUL_CACERT... as the consul CLI
		var err error
		if client, err = api.NewClient(ccfg); err != nil {
			return fmt.Errorf("consul client: %w", err)
		}
		token = ccfg.Token
		if cfg.Replicas == 1 && d.snap == nil {
			// Until Consul first answers, --replicas stands: at 1, a replica
			// whose watch never succeeds (a wrong token, an ACL-filtered
			// answer, an agent it cannot reach) enforces every limit whole.
			d.log.Warn("membership: --replicas is 1, so until Consul first answers this replica enforces every limit whole; set --replicas to the replica count you expect",
				"service", cfg.ConsulService)
		}
	}
	if cfg.PeersDNS != "" && cfg.Replicas == 1 && d.savedView(dnsKey(cfg.PeersDNS)) == nil {
		// As with Consul: until the name first resolves, --replicas
		// stands, unless the state file saved a view.
		d.log.Warn("membership: --replicas is 1, so until --peers-dns first resolves this replica enforces every limit whole; set --replicas to the replica count you expect",
			"name", cfg.PeersDNS)
	}
	// The default view takes --consul-service's mapped domains too, if any
	// are mapped to it: they are divided by the same count.
	def := &view{service: cfg.ConsulService, group: descriptors.DefaultGroup, engine: d.engine, clock: d.clock}
	d.views = views{def}
	for _, service := range cfg.Services() {
		if service == cfg.ConsulService {
			continue
		}
		v := &view{service: service, domains: byService[service], engine: d.engine, clock: d.clock}
		var err error
		if v.group, err = d.engine.AddGroup(v.domains, 1/float64(cfg.Replicas)); err != nil {
			return fmt.Errorf("--domain-service %s: %w", service, err)
		}
		d.views = append(d.views, v)
	}
	for _, v := range d.views {
		first := membership.NewStatic(cfg.Replicas).View()
		if v.service != "" {
			c, err := membership.NewConsul(membership.ConsulConfig{
				Service: v.service, Filter: cfg.ConsulFilter, Datacenter: cfg.ConsulDatacenter,
				Node: cfg.Node, Stale: cfg.ConsulStale, Replicas: cfg.Replicas, Initial: d.savedView(v.service),
				QueryRate: cfg.ConsulQueryRate, WaitTime: cfg.ConsulWait, Token: token,
				IgnoreWeights: !cfg.ConsulWeights, NoCache: !cfg.ConsulCache, Grace: grace(cfg.MembershipGrace),
				Logger: d.log.With("component", "membership"), OnUpdate: v.observe, // it names the service itself
			}, client)
			if err != nil {
				return fmt.Errorf("consul membership of service %s: %w", v.service, err)
			}
			v.consul, first = c, c.View()
		} else if cfg.PeersDNS != "" {
			// --peers-dns excludes --consul-service and --domain-service:
			// this is the default view, and the only one.
			s, err := membership.NewDNS(membership.DNSConfig{
				Name: cfg.PeersDNS, Server: cfg.PeersDNSServer, Interval: cfg.PeersDNSInterval, Replicas: cfg.Replicas,
				Initial: d.savedView(dnsKey(cfg.PeersDNS)), Grace: grace(cfg.MembershipGrace), UpstreamBy: cfg.UpstreamBy,
				Logger: d.log.With("component", "membership"), OnUpdate: v.observe, // it names the name itself
			})
			if err != nil {
				return fmt.Errorf("dns membership of %s: %w", cfg.PeersDNS, err)
			}
			v.dns, v.name, first = s, cfg.PeersDNS, s.View()
		}
		// A DNS view's peers see a change up to one --peers-dns-interval
		// (and a lookup's timeout) after this replica: its grows wait
		// that too, even with --membership-hold 0.
		var lag time.Duration
		if v.dns != nil {
			lag = v.dns.PeersLag()
		}
		if v.watched() && (cfg.MembershipHold > 0 || lag > 0) {
			var err error
			if v.damper, err = membership.NewDamper(first, membership.DamperConfig{
				Hold: cfg.MembershipHold, PeersLag: lag, OnUpdate: v.publish,
				Logger: d.log.With("component", "membership", v.labelKey(), v.label()),
			}); err != nil {
				return fmt.Errorf("%s membership of %s: %w", first.Source, v.label(), err)
			}
		}
		if first.Source == "static" && unshared(cfg) {
			first.Fault = membership.FaultUnshared
			d.log.Warn("membership: every replica enforces every limit whole: this is upstream's deployment ("+human.Names(cfg.UpstreamBy)+
				"), whose replicas shared one count in Redis, and membership is static at --replicas 1, so N replicas admit up to N times each limit; "+
				"set "+config.EnvName("peers-dns")+" to a name that resolves to every replica (a Kubernetes headless Service, a compose service), "+
				"or "+config.EnvName("replicas")+" to the replica count", "fault", membership.FaultUnshared)
		}
		v.publish(first)
		v.register(reg)
		if v.consul != nil {
			v.demand = newDemander(v, d.engine, client, demandSettings{
				prefix: cfg.DemandPrefix, interval: cfg.DemandInterval, maxWrites: cfg.DemandMaxWrites,
				queryRate: cfg.ConsulQueryRate, node: cfg.Node, topKeys: cfg.DemandTopKeys,
			}, d.log.With("component", "demand"))
			v.demand.register(reg)
		}
	}
	reg.MustRegister(demandRules{d.views})
	d.engine.SetDemandTopKeys(cfg.DemandTopKeys)
	if cfg.ShareMode == config.ShareDemand {
		d.engine.SetShareMode(true)
	}
	return nil
}

// Run serves until ctx ends, then drains and stops; closing now cuts the
// drain and the graceful stop short. It returns once every goroutine it
// started has ended.
func (d *Daemon) Run(ctx context.Context, now <-chan struct{}) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if d.waitsForXDS() {
			d.log.Info("waiting for the first config from the xDS server before serving gRPC", "server", d.cfg.XDSServerURL)
			select {
			case <-d.xds.First():
			case <-gctx.Done():
				return nil // the stop below closes the listener
			}
		}
		// A stop that begins before Serve does (a signal right after start)
		// makes Serve return ErrServerStopped: that is a clean end too.
		if err := d.grpc.Serve(d.grpcLis); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("gRPC server: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := d.http.Serve(d.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("admin server: %w", err)
		}
		return nil
	})
	if d.local != nil {
		g.Go(func() error {
			if err := d.local.Serve(d.localLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("loopback admin server: %w", err)
			}
			return nil
		})
	}
	if d.debug != nil {
		g.Go(func() error {
			if err := d.debug.Serve(d.debugLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("debug server: %w", err)
			}
			return nil
		})
	}
	if d.metricsSrv != nil {
		g.Go(func() error {
			if err := d.metricsSrv.Serve(d.metricsLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("metrics server: %w", err)
			}
			return nil
		})
	}
	if d.watcher != nil {
		g.Go(func() error { return d.watcher.Run(gctx) })
	}
	if d.xds != nil {
		g.Go(func() error { return d.xds.Run(gctx) })
	}
	g.Go(func() error { return sweep(gctx, d.engine, d.cfg.SweepInterval, d.clock) })
	g.Go(func() error { return d.history(gctx) })
	if d.state != nil && d.cfg.StateInterval > 0 {
		g.Go(func() error { return d.state.checkpoints(gctx, d.cfg.StateInterval) })
	}
	for _, v := range d.views {
		if v.consul != nil {
			g.Go(func() error { return v.consul.Run(gctx) })
		}
		if v.dns != nil {
			g.Go(func() error { return v.dns.Run(gctx) })
		}
		if v.damper != nil {
			g.Go(func() error { return v.damper.Run(gctx) })
		}
		if v.demand != nil {
			g.Go(func() error { return v.demand.Run(gctx) })
		}
	}
	g.Go(func() error { return gcpace.Tuner{}.Run(gctx) })
	g.Go(func() error {
		<-gctx.Done()
		// Report NOT_SERVING first, keep answering while Envoy moves away, then
		// stop gracefully with a deadline.
		d.log.Info("shutting down: draining", "drain", d.cfg.Drain)
		d.admin.SetDraining()
		d.health.Shutdown()
		stopping := time.Now()
		shutdown{Drain: d.cfg.Drain, Timeout: d.cfg.ShutdownTimeout, Now: now, Log: d.log}.run(d.grpc, d.streams.Close, d.httpServers()...)
		if d.state != nil {
			// After the gRPC server stopped: no decision changes a
			// bucket any more. The write gets what is left of
			// --shutdown-timeout after the drain and the in-flight calls.
			left := d.cfg.ShutdownTimeout - max(time.Since(stopping)-d.cfg.Drain, 0)
			d.state.finalWrite(left)
		}
		d.log.Info("stopped")
		return nil
	})
	return g.Wait()
}

// rampHorizon is the longest a join ramp can run with --join-ramp ramp.
func rampHorizon(ramp time.Duration) time.Duration {
	if ramp > 0 {
		return ramp
	}
	return config.MaxAutoJoinRamp
}

// restore puts the snapshot read at start into the engine, once: against
// the rules in force (set nil), or against set, the first rules from xDS,
// just before they are installed.
func (d *Daemon) restore(set *descriptors.Set) {
	d.restoreOnce.Do(func() {
		if d.snap == nil {
			return
		}
		d.state.restore(d.snap, set, d.started)
		d.snap = nil
	})
}

// httpServers are the admin server and, when there are, the debug and
// metrics servers.
func (d *Daemon) httpServers() []*http.Server {
	out := []*http.Server{d.http}
	for _, s := range []*http.Server{d.local, d.debug, d.metricsSrv} {
		if s != nil {
			out = append(out, s)
		}
	}
	return out
}

// sweep drops refilled buckets every interval until ctx ends.
func sweep(ctx context.Context, e *descriptors.Engine, every time.Duration, clock monotime.Clock) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			e.Sweep(clock())
		}
	}
}
