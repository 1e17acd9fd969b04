package server

import (
	"fmt"
	"io"
	"net/http"
	"net/http/pprof"
	"slices"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/membership"
)

// debugEndpoints are upstream's debug listener's paths (its DEBUG_PORT, 6070)
// and what its index says of each.
var debugEndpoints = []struct{ path, help string }{
	{"/debug/pprof/", "root of various pprof endpoints. hit for help."},
	{"/debug/pprof/profile", "CPU profiling endpoint"},
	{"/debug/pprof/trace", "trace endpoint"},
	{"/rlconfig", "print out the currently loaded configuration for debugging"},
}

// DebugHandler serves upstream's debug listener, as tools written for
// envoyproxy/ratelimit read it: an index of its endpoints at /, /rlconfig in
// upstream's text (UpstreamRules), and pprof under /debug/pprof/. The admin
// listener keeps sharelimit's own pages, /rlconfig with shares and membership
// among them.
func (a *Admin) DebugHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		for _, e := range debugEndpoints {
			fmt.Fprintf(w, "%s: %s\n", e.path, e.help)
		}
	})
	mux.HandleFunc("GET /rlconfig", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		UpstreamRules(w, a.engine.Set())
		if v := a.views()[0]; v.Fault == membership.FaultUnshared {
			// Not upstream's: a line no rule can start, for an SRE who
			// reads this page and not the admin listener's.
			fmt.Fprintf(w, "# sharelimit: membership fault=%s: each replica enforces every limit above whole, where upstream's replicas shared one count; set SHARELIMIT_PEERS_DNS to a name that resolves to every replica, or SHARELIMIT_REPLICAS to their count\n", v.Fault)
		}
	})
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	return mux
}

// UpstreamRules writes set's rules as upstream's /rlconfig prints them, one
// line for each rule with a rate_limit (an unlimited one too):
//
//	domain.key_value.key2: unit=MINUTE requests_per_unit=10, shadow_mode: false, quota_mode: false
//
// The figures are the YAML's, the cluster-wide limit, not this replica's
// share. Upstream prints in map order, which varies; these are sorted by key.
func UpstreamRules(w io.Writer, set *descriptors.Set) {
	type line struct{ key, text string }
	var lines []line
	for _, r := range set.Rules() {
		l := r.Limit()
		if l == nil {
			continue
		}
		lines = append(lines, line{r.Path(), fmt.Sprintf("%s: unit=%s requests_per_unit=%d, shadow_mode: %t, quota_mode: %t\n",
			r.Path(), ratelimitv3.RateLimitResponse_RateLimit_Unit(l.Unit()).String(), l.RequestsPerUnit(), r.ShadowMode(), r.QuotaMode())})
	}
	slices.SortStableFunc(lines, func(a, b line) int { return strings.Compare(a.key, b.key) })
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(l.text)
	}
	io.WriteString(w, b.String())
}
