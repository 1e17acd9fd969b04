package daemon

import (
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sharelimit/sharelimit/descriptors"

	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/server"
)

// installer is where every config source delivers: it installs a valid set in
// the engine, binds its metrics first so no decision counts against a set
// without its series, and keeps the status the admin pages show. It owns the
// config series. Safe for concurrent use.
type installer struct {
	engine  *engine.Engine
	metrics *server.Metrics
	log     *slog.Logger
	dir     string
	// clock is the engine's: every install after the first is a reload
	// while serving, at its reading (engine.Engine.SwapAt).
	clock func() int64

	mu        sync.Mutex
	status    server.ReloadStatus
	installed func(*descriptors.Set) // called after each install; set once before sources run
	before    func(*descriptors.Set) // called before each install; set once before sources run
	// source reports where sets come from; set once before sources run.
	source func() server.SourceStatus

	reloads    *prometheus.CounterVec
	lastOK     prometheus.Gauge
	generation prometheus.Gauge
	rules      prometheus.Gauge
}

func newInstaller(engine *engine.Engine, metrics *server.Metrics, dir string, log *slog.Logger, clock func() int64) *installer {
	in := &installer{engine: engine, metrics: metrics, dir: dir, log: log, clock: clock,
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sharelimit_config_reloads_total",
			Help: "Config loads by result (success, failure)."}, []string{"result"}),
		lastOK: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_config_last_reload_success_timestamp_seconds",
			Help: "When the config in force was loaded."}),
		generation: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_config_generation",
			Help: "Counts successful config loads; the one in force."}),
		rules: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_config_rules",
			Help: "Descriptors in the config in force."}),
	}
	metrics.Registry.MustRegister(in.reloads, in.lastOK, in.generation, in.rules)
	in.reloads.WithLabelValues("success")
	in.reloads.WithLabelValues("failure")
	return in
}

// install puts set in force. Buckets of the rules it keeps keep their state,
// at their fill ratio when the limit changed. The first set installs as at
// start-up; every later one is a reload while serving
// (engine.Engine.SwapAt), in which a rule added within the burst time
// of a retired one ramps, and the log names the rules whose ramp still
// runs. Every set that compiled is accepted.
func (in *installer) install(set *descriptors.Set) error {
	if in.before != nil {
		in.before(set)
	}
	in.metrics.Bind(set)
	in.mu.Lock()
	first := in.status.Generation == 0
	in.mu.Unlock()
	var old *descriptors.Set
	var ramping []string
	if first {
		old = in.engine.Swap(set)
	} else {
		at := in.clock()
		old = in.engine.SwapAt(set, at)
		for _, r := range in.engine.Ramping(at) {
			ramping = append(ramping, r.Path())
		}
	}
	if old != nil {
		in.metrics.Unbind(old)
	}
	now := time.Now()
	in.mu.Lock()
	in.status.Generation++
	in.status.LoadedAt, in.status.LastAttempt, in.status.LastError, in.status.Files = now, now, "", set.Files()
	gen := in.status.Generation
	in.mu.Unlock()
	in.reloads.WithLabelValues("success").Inc()
	in.lastOK.Set(float64(now.UnixNano()) / 1e9)
	in.generation.Set(float64(gen))
	in.rules.Set(float64(set.Len()))
	if in.installed != nil {
		in.installed(set)
	}
	in.log.Info("config loaded", "dir", in.dir, "generation", gen, "files", len(set.Files()), "domains", len(set.Domains()), "descriptors", set.Len())
	if len(ramping) > 0 {
		in.log.Info("rules ramping: added within the burst time of a retired rule, each may be that rule renamed, so it started empty and fills over its own burst time",
			"rules", strings.Join(ramping, ","))
	}
	if len(set.Files()) == 0 {
		in.log.Warn("config dir has no *.yaml or *.yml files: every request is OK", "dir", in.dir)
	}
	for _, w := range set.Warnings(max(1, int(1/in.engine.Weight().W+0.5))) {
		in.log.Warn(w)
	}
	return nil
}

// onInstall has fn called after every install, with the set put in force.
// Call it before any source runs.
func (in *installer) onInstall(fn func(*descriptors.Set)) { in.installed = fn }

// reject records a config that failed to load; the rules in force stay.
func (in *installer) reject(err error) {
	in.reloads.WithLabelValues("failure").Inc()
	in.mu.Lock()
	in.status.LastAttempt, in.status.LastError = time.Now(), err.Error()
	in.mu.Unlock()
	for _, e := range strings.Split(err.Error(), "\n") {
		in.log.Error("config rejected; keeping the rules in force", "error", e)
	}
}

// Status is the outcome of the last load, for the admin pages.
func (in *installer) Status() server.ReloadStatus {
	in.mu.Lock()
	st := in.status
	in.mu.Unlock()
	if in.source != nil {
		st.Source = in.source()
	} else {
		st.Source = server.SourceStatus{Kind: "file", Location: in.dir}
	}
	return st
}
