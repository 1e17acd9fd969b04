package server

import (
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"net/http"
	"net/http/pprof"
	"sort"
	"strconv"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sharelimit/sharelimit/descriptors"
)

// View is the membership view as the admin pages show it.
type View struct {
	Source     string    `json:"source"`
	Total      int       `json:"total"`
	Local      int       `json:"local"`
	Weight     float64   `json:"weight"`
	ObservedAt time.Time `json:"observed_at"`
	AgeSeconds float64   `json:"age_seconds"`
	LastError  string    `json:"last_error,omitempty"`
	Errors     uint64    `json:"errors"`
}

// ReloadStatus is the outcome of the last config load, and where configs
// come from.
type ReloadStatus struct {
	Source      SourceStatus `json:"source"`
	Generation  int          `json:"generation"`
	LoadedAt    time.Time    `json:"loaded_at"`
	LastAttempt time.Time    `json:"last_attempt"`
	LastError   string       `json:"last_error,omitempty"`
	Files       []string     `json:"files"`
}

// SourceStatus is where the rules come from: files in a directory, or an xDS
// management server, with what the latter has said.
type SourceStatus struct {
	Kind     string `json:"kind"`     // "file" or "xds"
	Location string `json:"location"` // the directory, or the server's address
	// The xDS source's state; zero for files.
	Connected      bool      `json:"connected,omitempty"`
	ConnectedSince time.Time `json:"connected_since,omitzero"`
	Version        string    `json:"version,omitempty"` // the version in force (last ACKed)
	LastError      string    `json:"last_error,omitempty"`
	Updates        uint64    `json:"updates,omitempty"`
	Nacks          uint64    `json:"nacks,omitempty"`
	LastNack       *Nack     `json:"last_nack,omitempty"`
}

// Nack is an xDS update refused: the rules in force stayed.
type Nack struct {
	Version string    `json:"version"`
	Error   string    `json:"error"`
	At      time.Time `json:"at"`
}

// Admin serves the admin HTTP listener. Safe for concurrent use.
type Admin struct {
	svc      *Service
	engine   *descriptors.Engine
	metrics  *Metrics
	view     func() View
	reload   func() ReloadStatus
	ready    atomic.Bool
	draining atomic.Bool
	version  string
	page     *template.Template
}

// NewAdmin returns the admin handler set. view and reload are read per request.
func NewAdmin(svc *Service, engine *descriptors.Engine, metrics *Metrics, view func() View, reload func() ReloadStatus) *Admin {
	return &Admin{svc: svc, engine: engine, metrics: metrics, view: view, reload: reload, page: newStatusPage()}
}

// SetVersion names the build on the status page.
func (a *Admin) SetVersion(v string) { a.version = v }

// SetReady sets whether /healthcheck answers 200 (while not draining): the
// daemon says so once the config it needs is in force.
func (a *Admin) SetReady(ok bool) { a.ready.Store(ok) }

// SetDraining makes /healthcheck answer 503 for the rest of the process's
// life, and sharelimit_draining 1.
func (a *Admin) SetDraining() {
	a.draining.Store(true)
	a.metrics.draining.Set(1)
}

// Handler routes the admin endpoints.
func (a *Admin) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", a.statusPage)
	mux.HandleFunc("GET /healthcheck", a.healthcheck)
	mux.HandleFunc("POST /json", a.json)
	mux.HandleFunc("GET /rlconfig", a.rlconfig)
	mux.Handle("GET /metrics", promhttp.HandlerFor(a.metrics.Registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

func (a *Admin) healthcheck(w http.ResponseWriter, _ *http.Request) {
	switch {
	case a.draining.Load():
		http.Error(w, "draining", http.StatusServiceUnavailable)
	case !a.ready.Load():
		http.Error(w, "config not loaded", http.StatusServiceUnavailable)
	default:
		io.WriteString(w, "OK")
	}
}

// json is upstream's /json: a protojson RateLimitRequest in, the response out,
// 200 when OK and 429 when over limit.
func (a *Admin) json(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRecvMsgSize))
	if err != nil {
		http.Error(w, "read body: "+err.Error(), http.StatusRequestEntityTooLarge)
		return
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		a.metrics.invalid.Inc()
		http.Error(w, "invalid RateLimitRequest JSON: "+err.Error(), http.StatusBadRequest)
		return
	}
	resp, err := a.svc.ShouldRateLimit(r.Context(), &req)
	if err != nil {
		code := http.StatusInternalServerError
		if status.Code(err) == codes.InvalidArgument {
			code = http.StatusBadRequest
		}
		http.Error(w, status.Convert(err).Message(), code)
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		w.WriteHeader(http.StatusTooManyRequests)
	}
	w.Write(out)
}

// RuleInfo is one rule as /rlconfig reports it.
type RuleInfo struct {
	Domain        string  `json:"domain"`
	Rule          string  `json:"rule"`
	Position      string  `json:"position"`
	Limit         string  `json:"limit"`
	Unlimited     bool    `json:"unlimited,omitempty"`
	ClusterRate   float64 `json:"cluster_rate_per_second"`
	ClusterBurst  uint64  `json:"cluster_burst"`
	LocalRate     float64 `json:"local_rate_per_second"`
	LocalBurst    float64 `json:"local_burst"`
	PerValue      bool    `json:"per_value,omitempty"`
	ShadowMode    bool    `json:"shadow_mode,omitempty"`
	Name          string  `json:"name,omitempty"`
	BelowOneToken bool    `json:"below_one_token,omitempty"`
}

// Config is what /rlconfig reports.
type Config struct {
	Membership View         `json:"membership"`
	Reload     ReloadStatus `json:"reload"`
	Buckets    int          `json:"buckets"`
	MaxBuckets int          `json:"max_buckets"`
	Overflowed uint64       `json:"overflowed"`
	Rules      []RuleInfo   `json:"rules"`
}

// Snapshot gathers /rlconfig's figures.
func (a *Admin) Snapshot() Config {
	w := a.engine.Weight().W
	c := Config{Membership: a.view(), Reload: a.reload(), Buckets: a.engine.Store().Live(),
		MaxBuckets: a.engine.Store().Max(), Overflowed: a.engine.Store().Overflowed()}
	for _, r := range a.engine.Set().Rules() {
		lim := r.Limit()
		if lim == nil {
			continue
		}
		info := RuleInfo{Domain: r.Domain(), Rule: r.Path(), Position: r.Pos().String(), Limit: lim.String(),
			Unlimited: lim.Unlimited(), PerValue: r.PerValue(), ShadowMode: r.ShadowMode(), Name: lim.Name()}
		if !lim.Unlimited() {
			p := lim.Params()
			info.ClusterRate, info.ClusterBurst = p.Rate, lim.Burst()
			info.LocalRate, info.LocalBurst = p.Local(w)
			info.BelowOneToken = !p.Blocked() && p.Size*w < 1
		}
		c.Rules = append(c.Rules, info)
	}
	sort.SliceStable(c.Rules, func(i, j int) bool { return c.Rules[i].Domain < c.Rules[j].Domain })
	return c
}

func (a *Admin) rlconfig(w http.ResponseWriter, r *http.Request) {
	c := a.Snapshot()
	if r.URL.Query().Get("format") == "json" {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		enc.Encode(c)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	v := c.Membership
	fmt.Fprintf(w, "membership: source=%s total=%d local=%d weight=%s age=%.1fs", v.Source, v.Total, v.Local, trimFloat(v.Weight, 6), v.AgeSeconds)
	if v.LastError != "" {
		fmt.Fprintf(w, " last_error=%q", v.LastError)
	}
	fmt.Fprintf(w, "\nconfig: source=%s %s generation=%d loaded_at=%s", c.Reload.Source.Kind, c.Reload.Source.Location, c.Reload.Generation, c.Reload.LoadedAt.Format(time.RFC3339))
	if c.Reload.LastError != "" {
		fmt.Fprintf(w, " last_reload_failed=%q", c.Reload.LastError)
	}
	if src := c.Reload.Source; src.Kind == "xds" {
		fmt.Fprintf(w, "\nxds: connected=%t version=%q updates=%d nacks=%d", src.Connected, src.Version, src.Updates, src.Nacks)
		if src.LastNack != nil {
			fmt.Fprintf(w, " last_nack_version=%q last_nack=%q", src.LastNack.Version, src.LastNack.Error)
		}
		if src.LastError != "" {
			fmt.Fprintf(w, " last_error=%q", src.LastError)
		}
	}
	fmt.Fprintf(w, "\nbuckets: live=%d max=%d overflowed=%d\n", c.Buckets, c.MaxBuckets, c.Overflowed)
	for _, r := range c.Rules {
		if r.Unlimited {
			fmt.Fprintf(w, "%s: unlimited (%s)\n", r.Rule, r.Position)
			continue
		}
		fmt.Fprintf(w, "%s: %s; cluster %.6g/s burst %d; local share %.6g/s burst %.6g", r.Rule, r.Limit, r.ClusterRate, r.ClusterBurst, r.LocalRate, r.LocalBurst)
		if r.BelowOneToken {
			w.Write([]byte(" (share below one token: floored at 1)"))
		}
		if r.ShadowMode {
			w.Write([]byte(" shadow"))
		}
		fmt.Fprintf(w, " (%s)\n", r.Position)
	}
}

// trimFloat formats f with at most prec significant digits, as /rlconfig and
// the status page both show figures.
func trimFloat(f float64, prec int) string { return strconv.FormatFloat(f, 'g', prec, 64) }
