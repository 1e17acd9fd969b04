package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/internal/monotime"
	"github.com/sharelimit/sharelimit/membership"
	"github.com/sharelimit/sharelimit/reload"
	"github.com/sharelimit/sharelimit/server"
)

func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(strings.ToLower(cfg.LogLevel)))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve runs the daemon until ctx ends (SIGTERM or SIGINT), then drains. A
// second signal during the stop makes it stop at once.
func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) int {
	cfg, err := config.Parse("serve", args, getenv, stderr)
	if err != nil {
		if err.Error() != "flag: help requested" {
			fmt.Fprintln(stderr, "sharelimit:", err)
		}
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(stderr, "sharelimit: invalid settings:")
		fmt.Fprintln(stderr, err)
		return 2
	}
	log := newLogger(cfg, stderr)
	hardStop, release := signalAfter(ctx, os.Interrupt, syscall.SIGTERM)
	defer release()
	if err := runDaemon(ctx, hardStop, cfg, log, stderr); err != nil {
		log.Error("sharelimit stopped", "err", err)
		return 1
	}
	return 0
}

// runDaemon serves until ctx ends, then drains and stops; closing hardStop cuts
// the drain and the graceful stop short.
func runDaemon(ctx context.Context, hardStop <-chan struct{}, cfg *config.Config, log *slog.Logger, stderr io.Writer) error {
	clock := monotime.New()
	for _, a := range []string{cfg.GRPCAddr, cfg.HTTPAddr} {
		if host, _, err := net.SplitHostPort(a); err == nil && !config.IsLoopback(host) {
			log.Warn("listening on a non-loopback address: anything that can reach it can spend this node's limits", "addr", a)
		}
	}

	// Rules first: an invalid config at start-up is fatal, with every error.
	store := bucket.NewStore(cfg.MaxBuckets)
	engine := descriptors.NewEngine(nil, 1/float64(cfg.Replicas), store)

	var view atomic.Pointer[membership.View]
	static := membership.NewStatic(cfg.Replicas).View()
	view.Store(&static)
	viewAge := func() float64 {
		v := view.Load()
		if v.ObservedAt.IsZero() {
			return 0
		}
		return time.Since(v.ObservedAt).Seconds()
	}
	metrics := server.NewMetrics(store.Live, store.Overflowed, store.Max(), viewAge)
	publish := func(v membership.View) {
		view.Store(&v)
		engine.SetWeight(v.Weight, clock())
		metrics.MemberTotal.Set(float64(v.Total))
		metrics.MemberLocal.Set(float64(v.Local))
		metrics.MemberWeight.Set(v.Weight)
		metrics.SetMembershipErrors(v.Errors)
		if !v.ObservedAt.IsZero() {
			metrics.MemberLastOK.Set(float64(v.ObservedAt.UnixNano()) / 1e9)
		}
	}
	publish(static)

	var reloadMu sync.Mutex
	var status server.ReloadStatus
	watcher := &reload.Watcher{
		Dir: cfg.ConfigDir, Debounce: cfg.ReloadDebounce, Poll: 10 * time.Second,
		Log: log.With("component", "reload"),
		Apply: func(set *descriptors.Set) {
			metrics.Bind(set)
			if old := engine.Swap(set); old != nil {
				metrics.Unbind(old)
			}
			now := time.Now()
			reloadMu.Lock()
			status.Generation++
			status.LoadedAt, status.LastAttempt, status.LastError, status.Files = now, now, "", set.Files()
			gen := status.Generation
			reloadMu.Unlock()
			metrics.Reloads.WithLabelValues("success").Inc()
			metrics.ReloadLast.Set(float64(now.UnixNano()) / 1e9)
			metrics.Generation.Set(float64(gen))
			metrics.Rules.Set(float64(set.Len()))
			log.Info("config loaded", "dir", cfg.ConfigDir, "generation", gen, "files", len(set.Files()), "domains", len(set.Domains()), "descriptors", set.Len())
			if len(set.Files()) == 0 {
				log.Warn("config dir has no *.yaml or *.yml files: every request is OK", "dir", cfg.ConfigDir)
			}
			for _, w := range set.Warnings(max(1, int(1/engine.Weight().W+0.5))) {
				log.Warn(w)
			}
		},
	}
	// The watcher knows no metrics; the gauge reads it. A 1 means reloads wait
	// for the poll: on a node, usually fs.inotify.max_user_instances is spent.
	metrics.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sharelimit_config_watch_polling",
		Help: "1 when fsnotify cannot watch the config dir and changes to it are seen only by polling; 0 otherwise.",
	}, func() float64 {
		if watcher.Polling() {
			return 1
		}
		return 0
	}))
	if err := watcher.Load(); err != nil {
		printErrors(stderr, err)
		return errors.New("invalid config at start-up")
	}
	// From now on a bad config is a failed reload: logged, counted, and the
	// rules in force stay.
	watcher.Error = func(err error) {
		metrics.Reloads.WithLabelValues("failure").Inc()
		reloadMu.Lock()
		status.LastAttempt, status.LastError = time.Now(), err.Error()
		reloadMu.Unlock()
		for _, e := range strings.Split(err.Error(), "\n") {
			log.Error("config rejected; keeping the rules in force", "error", e)
		}
	}

	// Membership: static unless --consul-service.
	var consul *membership.Consul
	if cfg.ConsulService != "" {
		ccfg := api.DefaultConfig() // CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, CONSUL_CACERT... as the consul CLI
		client, err := api.NewClient(ccfg)
		if err != nil {
			return fmt.Errorf("consul client: %w", err)
		}
		consul, err = membership.NewConsul(membership.ConsulConfig{
			Service: cfg.ConsulService, Filter: cfg.ConsulFilter, Datacenter: cfg.ConsulDatacenter,
			Node: cfg.Node, Stale: cfg.ConsulStale, Replicas: cfg.Replicas,
			QueryRate: cfg.ConsulQueryRate, WaitTime: cfg.ConsulWait, Token: ccfg.Token,
			Logger: log.With("component", "membership"), OnUpdate: publish,
		}, client)
		if err != nil {
			return fmt.Errorf("consul membership: %w", err)
		}
		publish(consul.View())
	}

	svc := server.NewService(engine, clock, metrics, server.Options{
		ShadowMode: cfg.ShadowMode, ResponseHeaders: cfg.ResponseHeaders,
		HeaderLimit: cfg.HeaderLimit, HeaderRemaining: cfg.HeaderRemaining, HeaderReset: cfg.HeaderReset,
	}, log.With("component", "grpc"))
	var tlsConfig *tls.Config
	if cfg.GRPCTLSCert != "" {
		var err error
		if tlsConfig, err = server.TLSConfig(cfg.GRPCTLSCert, cfg.GRPCTLSKey, cfg.GRPCTLSClientCA); err != nil {
			return err
		}
	}
	health := server.NewHealth()
	streams := server.NewStreamCloser()
	grpcServer := server.NewGRPCServer(svc, health, tlsConfig, streams.ServerOption())
	admin := server.NewAdmin(svc, engine, metrics, func() server.View {
		v := view.Load()
		return server.View{Source: v.Source, Total: v.Total, Local: v.Local, Weight: v.Weight,
			ObservedAt: v.ObservedAt, AgeSeconds: viewAge(), LastError: v.LastError, Errors: v.Errors}
	}, func() server.ReloadStatus {
		reloadMu.Lock()
		defer reloadMu.Unlock()
		return status
	})
	admin.SetVersion(version)
	admin.SetReady()

	grpcLis, err := server.Listen(cfg.GRPCAddr)
	if err != nil {
		return fmt.Errorf("gRPC listener: %w", err)
	}
	httpLis, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		grpcLis.Close()
		return fmt.Errorf("admin listener: %w", err)
	}
	httpServer := &http.Server{Handler: admin.Handler(), ReadHeaderTimeout: 10 * time.Second}
	log.Info("sharelimit serving", "version", version, "grpc", grpcLis.Addr().String(), "http", httpLis.Addr().String(),
		"membership", engine.Weight().W, "source", view.Load().Source, "max_buckets", cfg.MaxBuckets)

	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := grpcServer.Serve(grpcLis); err != nil && !errors.Is(err, net.ErrClosed) {
			return fmt.Errorf("gRPC server: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		if err := httpServer.Serve(httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("admin server: %w", err)
		}
		return nil
	})
	g.Go(func() error { return watcher.Run(gctx) })
	g.Go(func() error {
		return store.Sweeper(gctx, cfg.SweepInterval, engine.Weight, clock, func(d int) { metrics.BucketsSwept.Add(float64(d)) })
	})
	if consul != nil {
		g.Go(func() error { return consul.Run(gctx) })
	}
	g.Go(func() error { return server.GCTuner{}.Run(gctx) })
	g.Go(func() error {
		<-gctx.Done()
		// Report NOT_SERVING first, keep answering while Envoy moves away, then
		// stop gracefully with a deadline.
		log.Info("shutting down: draining", "drain", cfg.Drain)
		admin.SetDraining()
		metrics.Draining.Set(1)
		health.Shutdown()
		shutdown{Drain: cfg.Drain, Timeout: cfg.ShutdownTimeout, Now: hardStop, Log: log}.run(grpcServer, streams.Close, httpServer)
		log.Info("stopped")
		return nil
	})
	return g.Wait()
}
