package server

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/internal/human"
	"github.com/sharelimit/sharelimit/membership"
	"github.com/sharelimit/sharelimit/server/rlqs"
)

// RuleInfo is one rule as /rlconfig reports it.
type RuleInfo struct {
	Domain   string `json:"domain"`
	Rule     string `json:"rule"`
	Position string `json:"position"`
	Limit    string `json:"limit"`
	// Unit is the limit's unit, in which the pages show its rates.
	Unit         string  `json:"unit,omitempty"`
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

// RLConfig is what /rlconfig reports, as JSON with ?format=json, and what
// the status page is built from.
type RLConfig struct {
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
	// RLQS is the Rate Limit Quota Service's streams and shares; nil until
	// an Envoy has opened a stream.
	RLQS *rlqs.Snapshot `json:"rlqs,omitempty"`
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

// RLConfig gathers /rlconfig's figures.
func (a *Admin) RLConfig() RLConfig {
	views := a.views()
	store := a.engine.Store()
	c := RLConfig{Membership: views[0], Services: views[1:], Reload: a.reload(), Buckets: store.Live(),
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
			info.Unit = lim.Unit().String()
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
	if a.rlqs != nil {
		c.RLQS = a.rlqs()
	}
	return c
}

func (a *Admin) rlconfig(w http.ResponseWriter, r *http.Request) {
	c := a.RLConfig()
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
		fmt.Fprintf(w, "\njoin ramp: new buckets start emptier than full, %s in, over in %s; rejected=%d withheld_tokens=%d",
			seconds(r.ElapsedSeconds), seconds(r.EndsInSeconds), r.Rejected, r.WithheldTokens)
	}
	w.Write([]byte("\n"))
	for _, r := range c.Rules {
		if r.Unlimited {
			fmt.Fprintf(w, "%s: unlimited (%s)\n", r.Rule, r.Position)
			continue
		}
		fmt.Fprintf(w, "%s: %s; cluster %s burst %s; local share %s burst %s", r.Rule, r.Limit, human.Rate(r.ClusterRate, r.Unit),
			human.Count(r.ClusterBurst), human.Rate(r.LocalRate, r.Unit), human.Number(r.LocalBurst))
		switch {
		case r.Share == descriptors.ShareReplica.String():
			w.Write([]byte(" (share: replica, not divided)"))
		case r.Service != "":
			fmt.Fprintf(w, " (weight %s of service %s)", trimFloat(r.Weight, 6), r.Service)
		}
		if r.RampSeconds > 0 {
			fmt.Fprintf(w, " (join ramp: new buckets fill over %s)", seconds(r.RampSeconds))
		}
		if r.BelowOneToken {
			w.Write([]byte(" (share below one token: floored at 1)"))
		}
		if r.ShadowMode {
			w.Write([]byte(" shadow"))
		}
		fmt.Fprintf(w, " (%s)\n", r.Position)
	}
	if c.RLQS != nil {
		writeRLQS(w, c.RLQS)
	}
}

// writeView writes one membership view as a line of /rlconfig's text.
func writeView(w io.Writer, label string, v View) {
	fmt.Fprintf(w, "%s: source=%s", label, v.Source)
	if v.Service != "" {
		fmt.Fprintf(w, " service=%s", v.Service)
	}
	if v.Name != "" {
		fmt.Fprintf(w, " name=%s", v.Name)
	}
	if len(v.Domains) > 0 {
		fmt.Fprintf(w, " domains=%s", strings.Join(v.Domains, ","))
	}
	fmt.Fprintf(w, " total=%d local=%d", v.Total, v.Local)
	if v.TotalWeight != v.Total || v.LocalWeight != v.Local {
		fmt.Fprintf(w, " total_weight=%d local_weight=%d", v.TotalWeight, v.LocalWeight)
	}
	fmt.Fprintf(w, " weight=%s (%s)", trimFloat(v.Weight, 6), human.Share(v.Weight))
	if v.Source == "static" {
		// Nothing watches a static view: no age, errors or held change.
		fmt.Fprintf(w, ": static, --replicas %d", v.Total)
		if v.Fault == membership.FaultUnshared {
			fmt.Fprintf(w, " fault=%s: every replica enforces every limit whole, where upstream's replicas shared one count; set SHARELIMIT_PEERS_DNS to a name that resolves to every replica, or SHARELIMIT_REPLICAS to their count", v.Fault)
		}
		return
	}
	fmt.Fprintf(w, ", confirmed %s", human.AgoSeconds(v.AgeSeconds, v.ObservedAt.IsZero()))
	if p := v.Pending; p != nil {
		fmt.Fprintf(w, " pending: weight=%s total=%d local=%d at=%s (in %s, if it holds)",
			trimFloat(p.Weight, 6), p.Total, p.Local, p.At.UTC().Format(time.RFC3339Nano), seconds(p.InSecs))
	}
	if v.LastError != "" {
		fmt.Fprintf(w, " last_error=%q", v.LastError)
	}
	if v.Fault != "" {
		fmt.Fprintf(w, " fault=%s", v.Fault)
	}
	if d := v.Demand; d != nil {
		fmt.Fprintf(w, "\n  demand: leading=%t leader=%q params_age=%s stale=%t writes=%d write_errors=%d",
			d.Leading, d.Leader, seconds(d.ParamsAgeSeconds), d.Stale, d.Writes, d.Errors)
		if d.Counted != "" {
			fmt.Fprintf(w, " report=%q", d.Counted)
		}
		if d.WriteError != "" {
			fmt.Fprintf(w, " write_error=%q", d.WriteError)
		}
		for _, b := range d.BadReports {
			fmt.Fprintf(w, "\n  demand report unusable: node=%q cause=%s: %q", b.Node, b.Cause, b.Error)
		}
		for _, r := range d.Rules {
			fmt.Fprintf(w, "\n  demand %s%s: offered %s, admitted %s, share=%s equal=%s cluster_admitted_ratio=%.3f",
				r.Rule, valueSuffix(r.Value), human.Rate(r.Offered, "second"), human.Rate(r.Admitted, "second"), trimFloat(r.Share, 6), trimFloat(r.Equal, 6), r.ClusterAdmittedRatio)
		}
		for _, r := range d.Division {
			fmt.Fprintf(w, "\n  divided %s%s: node=%s units=%d offered %s, admitted %s, share=%s", r.Rule, valueSuffix(r.Value), r.Node, r.Units,
				human.Rate(r.Offered, "second"), human.Rate(r.Admitted, "second"), trimFloat(r.Share, 6))
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

// seconds formats a span given in seconds as the pages do: "1.5 s", "2 min 5 s".
func seconds(s float64) string { return human.Seconds(s) }
