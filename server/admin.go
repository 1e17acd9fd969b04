package server

import (
	"html/template"
	"io"
	"net/http"
	"net/http/pprof"
	"strconv"
	"sync/atomic"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/sharelimit/sharelimit/demand/controller"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/server/rlqs"
)

// View is one membership view as the admin pages show it: the default
// (--consul-service, or the static count) or one --domain-service service's.
type View struct {
	Source string `json:"source"`
	// Service is the Consul service counted; "" for static and DNS
	// membership.
	Service string `json:"service,omitempty"`
	// Name is the DNS name whose addresses are counted (--peers-dns); ""
	// for static and Consul membership.
	Name string `json:"name,omitempty"`
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
	// Fault names what keeps the view from being the cluster's
	// (membership.Fault*), "" when nothing does.
	Fault string `json:"fault,omitempty"`
	// Pending is a change held back by --membership-hold: a view that grows
	// this replica's share applies only once it has held. nil when none.
	Pending *Pending `json:"pending,omitempty"`
	// Demand is the service's demand sharing, once it has demand-shared
	// rules; nil otherwise.
	Demand *DemandStatus `json:"demand,omitempty"`
}

// The demand controller's admin view, under the names the admin pages'
// code has always used for it.
type (
	DemandStatus    = controller.Status
	DemandBadReport = controller.BadReport
	DemandReplica   = controller.Replica
	DemandRule      = controller.RuleRow
)

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
	engine   *engine.Engine
	metrics  *Metrics
	views    func() []View
	reload   func() ReloadStatus
	ready    atomic.Bool
	draining atomic.Bool
	version  string
	page     *template.Template
	history  *history
	// rlqs is the RLQS service's snapshot, nil while unused (SetRLQS).
	rlqs func() *rlqs.Snapshot
}

// NewAdmin returns the admin handler set. views and reload are read per
// request; views gives the default view first, then one per mapped service.
func NewAdmin(svc *Service, engine *engine.Engine, metrics *Metrics, views func() []View, reload func() ReloadStatus) *Admin {
	return &Admin{svc: svc, engine: engine, metrics: metrics, views: views, reload: reload, page: newStatusPage(), history: newHistory(time.Now())}
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
	mux.HandleFunc("GET /rlconfig/history", a.historyJSON)
	mux.HandleFunc("GET /rlconfig/admitted", a.admittedJSON)
	mux.HandleFunc("GET /status.css", statusStyle)
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

// trimFloat formats f with at most prec significant digits, as /rlconfig and
// the status page both show figures.
func trimFloat(f float64, prec int) string { return strconv.FormatFloat(f, 'g', prec, 64) }

// BeyondLoopback is the admin handler for a listener that is not on
// loopback. There it serves what upstream's admin port serves, /healthcheck
// and /json, and nothing else, to every client: a client's address cannot
// tell the pod's own processes from a service mesh's sidecar, which forwards
// other pods' requests from loopback (Istio's 127.0.0.6). Every other page
// (the status page, /rlconfig, /metrics, pprof) is on the loopback admin
// listener, local (--local-http-addr), which the 404 names.
func (a *Admin) BeyondLoopback(local string) http.Handler {
	full := a.Handler()
	msg := "404 not found: beyond loopback this listener serves only /healthcheck and /json, as upstream's admin port; " +
		"every other page is on the loopback admin listener " + local + " (kubectl port-forward reaches it)"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/healthcheck" || r.URL.Path == "/json" {
			full.ServeHTTP(w, r)
			return
		}
		http.Error(w, msg, http.StatusNotFound)
	})
}
