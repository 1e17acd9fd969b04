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
)

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

// historyJSON serves the rules' last ten minutes for scripts: the same
// rings the status page draws, every rule kept.
func (a *Admin) historyJSON(w http.ResponseWriter, _ *http.Request) {
	h := a.historyAt(time.Now(), nil)
	sort.Slice(h.Rules, func(i, j int) bool {
		if h.Rules[i].Domain != h.Rules[j].Domain {
			return h.Rules[i].Domain < h.Rules[j].Domain
		}
		return h.Rules[i].Rule < h.Rules[j].Rule
	})
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(h)
}
