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

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/internal/gcpace"
	"github.com/sharelimit/sharelimit/internal/monotime"
	"github.com/sharelimit/sharelimit/server"
	"github.com/sharelimit/sharelimit/server/rlqs"
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
	engine  *engine.Engine
	watcher *source.Watcher // nil with rules from xDS
	xds     *xds.Source     // nil with rules from files
	views   views           // the default membership view first, then one per --domain-service service
	admin   *server.Admin
	health  *health.Server
	streams *server.StreamCloser
	grpc    server.GRPC
	rlqs    *rlqs.Service // nil with --rlqs=false
	// rlqsSnap is what the pages show of it; nil with --rlqs=false.
	rlqsSnap func() *rlqs.Snapshot
	http     *http.Server
	grpcLis  net.Listener
	httpLis  net.Listener
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
	metrics := server.NewMetrics(store)
	if cfg.MetricsAddr != "" {
		metrics.CountUpstream(cfg.NearLimitRatio) // before any rule is bound
	}
	if cfg.StateFile != "" {
		// Before the engine, membership and the rules: the saved seed
		// keys the buckets, and the saved views stand until Consul
		// answers.
		d.state = newKeeper(d, metrics.Registry)
		d.snap = d.state.load(time.Now(), store.Max())
	}
	var err error
	if d.engine, err = engine.New(nil, store, engineOptions(cfg, d.snap)); err != nil {
		return nil, fmt.Errorf("--domain-service: %w", err)
	}
	if err := d.membership(metrics.Registry); err != nil {
		return nil, err
	}
	var rules *installer
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
		v.reshare = d.reshare
	}
	// Listen before building the gRPC server: grpc-go starts its stream
	// workers in NewServer, and a listener that fails must leave nothing
	// running behind it.
	if err := d.listen(); err != nil {
		return nil, err
	}
	d.health = server.NewHealth()
	d.streams = server.NewStreamCloser()
	opts, err := d.newRLQS(metrics)
	if err != nil {
		return nil, err
	}
	opts = append(opts, d.streams.ServerOption())
	if cfg.GRPCTransport == config.TransportDirect {
		d.grpc = server.NewDirectServer(svc, d.health, tlsConfig, log.With("component", "grpc"), opts...)
	} else {
		d.grpc = server.NewGRPCServer(svc, d.health, tlsConfig, opts...)
	}
	d.admin = server.NewAdmin(svc, d.engine, metrics, d.views.Admin, rules.Status)
	d.admin.SetVersion(version)
	if d.rlqsSnap != nil {
		d.admin.SetRLQS(d.rlqsSnap)
	}
	// Ready unless health waits for a config with a domain in it (upstream's
	// HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED); from now on every install
	// says again.
	d.setReady(d.readyWith(d.engine.Set()) && !d.waitsForXDS())
	rules.onInstall(func(set *descriptors.Set) {
		d.setReady(d.readyWith(set))
		d.markReload(rules)
		if d.rlqs != nil {
			d.rlqs.Reload()
		}
	})
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

// Run serves until ctx ends, then drains and stops; closing now cuts the
// drain and the graceful stop short. It returns once every goroutine it
// started has ended.
func (d *Daemon) Run(ctx context.Context, now <-chan struct{}) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return d.serveGRPC(gctx) })
	for _, s := range []struct {
		name string
		srv  *http.Server
		lis  net.Listener
	}{{"admin server", d.http, d.httpLis}, {"loopback admin server", d.local, d.localLis},
		{"debug server", d.debug, d.debugLis}, {"metrics server", d.metricsSrv, d.metricsLis}} {
		if s.srv != nil {
			g.Go(func() error {
				if err := s.srv.Serve(s.lis); err != nil && !errors.Is(err, http.ErrServerClosed) {
					return fmt.Errorf("%s: %w", s.name, err)
				}
				return nil
			})
		}
	}
	if d.watcher != nil {
		g.Go(func() error { return d.watcher.Run(gctx) })
	}
	if d.xds != nil {
		g.Go(func() error { return d.xds.Run(gctx) })
	}
	g.Go(func() error { return sweep(gctx, d.engine, d.cfg.SweepInterval, d.clock) })
	g.Go(func() error { return d.history(gctx) })
	if d.rlqs != nil {
		g.Go(func() error { return d.rlqs.Run(gctx) })
	}
	if d.state != nil && d.cfg.StateInterval > 0 {
		g.Go(func() error { return d.state.checkpoints(gctx, d.cfg.StateInterval) })
	}
	for _, v := range d.views {
		v.run(gctx, g)
	}
	g.Go(func() error { return gcpace.Tuner{}.Run(gctx) })
	g.Go(func() error {
		<-gctx.Done()
		d.stop(now)
		return nil
	})
	return g.Wait()
}

// serveGRPC serves gRPC until the stop, once the first config from xDS has
// come when serving waits for it.
func (d *Daemon) serveGRPC(ctx context.Context) error {
	if d.waitsForXDS() {
		d.log.Info("waiting for the first config from the xDS server before serving gRPC", "server", d.cfg.XDSServerURL)
		select {
		case <-d.xds.First():
		case <-ctx.Done():
			return nil // the stop closes the listener
		}
	}
	if d.rlqs != nil {
		d.rlqs.Serving() // Envoys can report from now on: the start hold runs from here
	}
	// A stop that begins before Serve does (a signal right after start)
	// makes Serve return ErrServerStopped: that is a clean end too.
	if err := d.grpc.Serve(d.grpcLis); err != nil && !errors.Is(err, net.ErrClosed) && !errors.Is(err, grpc.ErrServerStopped) {
		return fmt.Errorf("gRPC server: %w", err)
	}
	return nil
}

// stop reports NOT_SERVING first, keeps answering while Envoy moves away,
// then stops gracefully with a deadline, and writes the state file last.
func (d *Daemon) stop(now <-chan struct{}) {
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
func sweep(ctx context.Context, e *engine.Engine, every time.Duration, clock monotime.Clock) error {
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
