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
	"strings"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sharelimit/sharelimit/descriptors"
)

// View is one membership view as the admin pages show it: the default
// (--consul-service, or the static count) or one --domain-service service's.
type View struct {
	Source string `json:"source"`
	// Service is the Consul service counted; "" for static membership.
	Service string `json:"service,omitempty"`
	// Domains are the domains this view divides; empty for the default view,
	// which divides every domain not mapped to another service.
	Domains     []string  `json:"domains,omitempty"`
	Total       int       `json:"total"`
	Local       int       `json:"local"`
	TotalWeight int       `json:"total_weight"`
	LocalWeight int       `json:"local_weight"`
	Weight      float64   `json:"weight"`
	ObservedAt  time.Time `json:"observed_at"`
	AgeSeconds  float64   `json:"age_seconds"`
	LastError   string    `json:"last_error,omitempty"`
	Errors      uint64    `json:"errors"`
	// Pending is a change held back by --membership-hold: a view that grows
	// this replica's share applies only once it has held. nil when none.
	Pending *Pending `json:"pending,omitempty"`
	// Demand is the service's demand sharing, once it has demand-shared
	// rules; nil otherwise.
	Demand *DemandStatus `json:"demand,omitempty"`
}

// DemandStatus is one service's demand sharing as this replica sees it.
type DemandStatus struct {
	Leading bool `json:"leading"` // this replica divides
	// Leader is the node whose parameters are in force; "" without any.
	Leader           string  `json:"leader,omitempty"`
	ParamsAgeSeconds float64 `json:"params_age_seconds"`
	// Stale: the parameters are too old to use; equal shares apply.
	Stale  bool         `json:"stale"`
	Writes uint64       `json:"writes"`
	Errors uint64       `json:"write_errors"`
	Rules  []DemandRule `json:"rules"`
	// Division is every replica's demand and share in the last division,
	// per rule, busiest first and at most 64 per rule; only on the leader,
	// which alone reads every report.
	Division []DemandReplica `json:"division,omitempty"`
}

// DemandReplica is one replica in the leader's last division of a rule.
type DemandReplica struct {
	Rule string `json:"rule"`
	// Value is a per-value rule's hot value ("key=value, ..." as a request
	// named it, or its ID); "" for a rule with one bucket.
	Value    string  `json:"value,omitempty"`
	Node     string  `json:"node"`
	Units    uint32  `json:"units"`
	Offered  float64 `json:"offered_per_second"`
	Admitted float64 `json:"admitted_per_second"`
	Share    float64 `json:"share"`
	Absent   bool    `json:"absent,omitempty"` // no usable report: counted at its equal share
}

// DemandRule is one demand-shared rule on this replica.
type DemandRule struct {
	Rule string `json:"rule"`
	// Value is set on the rows of a per-value rule's hot values; the row of
	// the rule itself (every other value, at the equal share) has none.
	Value    string  `json:"value,omitempty"`
	Offered  float64 `json:"offered_per_second"`  // smoothed, this replica
	Admitted float64 `json:"admitted_per_second"` // smoothed, this replica
	Share    float64 `json:"share"`               // the weight in force
	Equal    float64 `json:"equal_share"`         // the membership weight
	// ClusterAdmittedRatio is the cluster's admitted rate ÷ L from the
	// reports the parameters in force were divided from; 0 without them.
	ClusterAdmittedRatio float64 `json:"cluster_admitted_ratio"`
}

// Pending is a held membership change, and when it takes effect if nothing
// else changes first.
type Pending struct {
	Total  int       `json:"total"`
	Local  int       `json:"local"`
	Weight float64   `json:"weight"`
	At     time.Time `json:"at"`
	InSecs float64   `json:"in_seconds"`
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
	views    func() []View
	reload   func() ReloadStatus
	ready    atomic.Bool
	draining atomic.Bool
	version  string
	page     *template.Template
}

// NewAdmin returns the admin handler set. views and reload are read per
// request; views gives the default view first, then one per mapped service.
func NewAdmin(svc *Service, engine *descriptors.Engine, metrics *Metrics, views func() []View, reload func() ReloadStatus) *Admin {
	return &Admin{svc: svc, engine: engine, metrics: metrics, views: views, reload: reload, page: newStatusPage()}
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
	Domain       string  `json:"domain"`
	Rule         string  `json:"rule"`
	Position     string  `json:"position"`
	Limit        string  `json:"limit"`
	Unlimited    bool    `json:"unlimited,omitempty"`
	ClusterRate  float64 `json:"cluster_rate_per_second"`
	ClusterBurst uint64  `json:"cluster_burst"`
	LocalRate    float64 `json:"local_rate_per_second"`
	LocalBurst   float64 `json:"local_burst"`
	PerValue     bool    `json:"per_value,omitempty"`
	// Share is "cluster" (divided by Weight) or "replica" (not divided).
	Share string `json:"share"`
	// Service is the Consul service whose view divides the rule's domain;
	// "" for the default view.
	Service       string  `json:"service,omitempty"`
	Weight        float64 `json:"weight"`
	ShadowMode    bool    `json:"shadow_mode,omitempty"`
	Name          string  `json:"name,omitempty"`
	BelowOneToken bool    `json:"below_one_token,omitempty"`
	// RampSeconds is the rule's join ramp while it is in progress: its new
	// buckets start at the ramp's elapsed time over this; 0 with none.
	RampSeconds float64 `json:"join_ramp_seconds,omitempty"`
}

// Config is what /rlconfig reports.
type Config struct {
	// Membership is the default view: --consul-service's, or the static count.
	Membership View `json:"membership"`
	// Services are the views of the --domain-service services, in flag order.
	Services   []View       `json:"services,omitempty"`
	Reload     ReloadStatus `json:"reload"`
	Buckets    int          `json:"buckets"`
	MaxBuckets int          `json:"max_buckets"`
	Overflowed uint64       `json:"overflowed"`
	// JoinRamp is the join ramp in progress (--join-ramp), nil when none.
	JoinRamp *JoinRamp  `json:"join_ramp,omitempty"`
	Rules    []RuleInfo `json:"rules"`
}

// JoinRamp is a join ramp in progress: new buckets start emptier than full.
type JoinRamp struct {
	// ElapsedSeconds is the time since the ramp began; a rule's new buckets
	// start at ElapsedSeconds ÷ its ramp (RuleInfo.RampSeconds), at most full.
	ElapsedSeconds float64 `json:"elapsed_seconds"`
	EndsInSeconds  float64 `json:"ends_in_seconds"`
	Rejected       uint64  `json:"rejected"`
	WithheldTokens uint64  `json:"withheld_tokens"`
}

// Snapshot gathers /rlconfig's figures.
func (a *Admin) Snapshot() Config {
	views := a.views()
	store := a.engine.Store()
	c := Config{Membership: views[0], Services: views[1:], Reload: a.reload(), Buckets: store.Live(),
		MaxBuckets: store.Max(), Overflowed: store.Overflowed()}
	now := a.svc.clock()
	ramp := store.Ramp(now)
	if ramp != nil {
		c.JoinRamp = &JoinRamp{ElapsedSeconds: float64(now-ramp.Start) / 1e9, EndsInSeconds: float64(ramp.End()-now) / 1e9,
			Rejected: store.RampRejected(), WithheldTokens: store.RampWithheld()}
	}
	serviceOf := map[string]string{}
	for _, v := range c.Services {
		for _, d := range v.Domains {
			serviceOf[d] = v.Service
		}
	}
	for _, r := range a.engine.Set().Rules() {
		lim := r.Limit()
		if lim == nil {
			continue
		}
		w := a.engine.RuleWeight(r).W
		info := RuleInfo{Domain: r.Domain(), Rule: r.Path(), Position: r.Pos().String(), Limit: lim.String(),
			Unlimited: lim.Unlimited(), PerValue: r.PerValue(), ShadowMode: r.ShadowMode(), Name: lim.Name(),
			Share: lim.Share().String(), Service: serviceOf[r.Domain()], Weight: w}
		if info.Service == "" {
			info.Service = c.Membership.Service
		}
		if !lim.Unlimited() {
			p := lim.Params()
			info.ClusterRate, info.ClusterBurst = p.Rate, lim.Burst()
			info.LocalRate, info.LocalBurst = p.Local(w)
			info.BelowOneToken = !p.Blocked() && p.Size*w < 1
			if ramp != nil {
				if d := ramp.Duration(&p); now-ramp.Start < int64(d) {
					info.RampSeconds = d.Seconds()
				}
			}
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
	writeView(w, "membership", c.Membership)
	for _, v := range c.Services {
		writeView(w, "\nmembership["+v.Service+"]", v)
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
	fmt.Fprintf(w, "\nbuckets: live=%d max=%d overflowed=%d", c.Buckets, c.MaxBuckets, c.Overflowed)
	if r := c.JoinRamp; r != nil {
		fmt.Fprintf(w, "\njoin ramp: new buckets start emptier than full, %.1fs in, over in %.1fs; rejected=%d withheld_tokens=%d",
			r.ElapsedSeconds, r.EndsInSeconds, r.Rejected, r.WithheldTokens)
	}
	w.Write([]byte("\n"))
	for _, r := range c.Rules {
		if r.Unlimited {
			fmt.Fprintf(w, "%s: unlimited (%s)\n", r.Rule, r.Position)
			continue
		}
		fmt.Fprintf(w, "%s: %s; cluster %.6g/s burst %d; local share %.6g/s burst %.6g", r.Rule, r.Limit, r.ClusterRate, r.ClusterBurst, r.LocalRate, r.LocalBurst)
		switch {
		case r.Share == descriptors.ShareReplica.String():
			w.Write([]byte(" (share: replica, not divided)"))
		case r.Service != "":
			fmt.Fprintf(w, " (weight %s of service %s)", trimFloat(r.Weight, 6), r.Service)
		}
		if r.RampSeconds > 0 {
			fmt.Fprintf(w, " (join ramp: new buckets fill over %.3gs)", r.RampSeconds)
		}
		if r.BelowOneToken {
			w.Write([]byte(" (share below one token: floored at 1)"))
		}
		if r.ShadowMode {
			w.Write([]byte(" shadow"))
		}
		fmt.Fprintf(w, " (%s)\n", r.Position)
	}
}

// writeView writes one membership view as a line of /rlconfig's text.
func writeView(w io.Writer, label string, v View) {
	fmt.Fprintf(w, "%s: source=%s", label, v.Source)
	if v.Service != "" {
		fmt.Fprintf(w, " service=%s", v.Service)
	}
	if len(v.Domains) > 0 {
		fmt.Fprintf(w, " domains=%s", strings.Join(v.Domains, ","))
	}
	fmt.Fprintf(w, " total=%d local=%d", v.Total, v.Local)
	if v.TotalWeight != v.Total || v.LocalWeight != v.Local {
		fmt.Fprintf(w, " total_weight=%d local_weight=%d", v.TotalWeight, v.LocalWeight)
	}
	fmt.Fprintf(w, " weight=%s age=%.1fs", trimFloat(v.Weight, 6), v.AgeSeconds)
	if p := v.Pending; p != nil {
		fmt.Fprintf(w, " pending: weight=%s total=%d local=%d at=%s (in %.1fs, if it holds)",
			trimFloat(p.Weight, 6), p.Total, p.Local, p.At.UTC().Format(time.RFC3339Nano), p.InSecs)
	}
	if v.LastError != "" {
		fmt.Fprintf(w, " last_error=%q", v.LastError)
	}
	if d := v.Demand; d != nil {
		fmt.Fprintf(w, "\n  demand: leading=%t leader=%q params_age=%.1fs stale=%t writes=%d write_errors=%d",
			d.Leading, d.Leader, d.ParamsAgeSeconds, d.Stale, d.Writes, d.Errors)
		for _, r := range d.Rules {
			fmt.Fprintf(w, "\n  demand %s%s: offered=%.4g/s admitted=%.4g/s share=%s equal=%s cluster_admitted_ratio=%.3f",
				r.Rule, valueSuffix(r.Value), r.Offered, r.Admitted, trimFloat(r.Share, 6), trimFloat(r.Equal, 6), r.ClusterAdmittedRatio)
		}
		for _, r := range d.Division {
			fmt.Fprintf(w, "\n  divided %s%s: node=%s units=%d offered=%.4g/s admitted=%.4g/s share=%s", r.Rule, valueSuffix(r.Value), r.Node, r.Units, r.Offered, r.Admitted, trimFloat(r.Share, 6))
			if r.Absent {
				w.Write([]byte(" absent"))
			}
		}
	}
}

// valueSuffix names a hot value after its rule's path, quoted (it comes
// from a request); "" for a rule with one bucket.
func valueSuffix(v string) string {
	if v == "" {
		return ""
	}
	return " value " + strconv.Quote(v)
}

// trimFloat formats f with at most prec significant digits, as /rlconfig and
// the status page both show figures.
func trimFloat(f float64, prec int) string { return strconv.FormatFloat(f, 'g', prec, 64) }
