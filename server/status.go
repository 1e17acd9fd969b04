package server

import (
	"html/template"
	"net/http"
	"strings"
	"time"
)

// Status is what the status page shows. It is built from the same snapshot as
// /rlconfig, so the two never disagree.
type Status struct {
	Config
	Version      string
	GeneratedAt  time.Time
	TopOverLimit []TopKey
}

// Views are every membership view: the default first, then the services'.
func (s Status) Views() []View { return append([]View{s.Membership}, s.Services...) }

// topWindow is how far back the status page looks for over-limit keys.
const topWindow = time.Minute

// newStatusPage parses the status page's template. It is built once per Admin,
// not held in a package variable.
func newStatusPage() *template.Template {
	return template.Must(template.New("status").Funcs(template.FuncMap{
		"pct":  func(w float64) string { return trimFloat(w*100, 4) + "%" },
		"num":  func(f float64) string { return trimFloat(f, 6) },
		"join": func(s []string) string { return strings.Join(s, ", ") },
		"time": func(t time.Time) string {
			if t.IsZero() {
				return "never"
			}
			return t.UTC().Format(time.RFC3339)
		},
	}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="5">
<title>sharelimit status</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:1.5em;color:#222}
h1{font-size:1.3em}h2{font-size:1.1em;margin-top:1.5em}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.25em .6em;text-align:left}
th{background:#f3f3f3}.num{text-align:right;font-variant-numeric:tabular-nums}.bad{color:#b00}
</style></head><body>
<h1>sharelimit {{.Version}}</h1>
<p>Refreshes every 5 s. Generated {{time .GeneratedAt}}. Machine-readable: <a href="/rlconfig?format=json">/rlconfig?format=json</a>, <a href="/metrics">/metrics</a>.</p>
<h2>Membership</h2>
{{range $i, $v := .Views}}{{if $v.Service}}<h3>Consul service {{$v.Service}}: {{if $v.Domains}}domains {{join $v.Domains}}{{else}}every domain not mapped to another service{{end}}</h3>{{end}}
<table id="membership{{if $i}}-{{$i}}{{end}}">
<tr><th>source</th><td>{{$v.Source}}</td></tr>
<tr><th>total replicas</th><td class="num">{{$v.Total}}</td></tr>
<tr><th>on this node</th><td class="num">{{$v.Local}}</td></tr>
{{if or (ne $v.TotalWeight $v.Total) (ne $v.LocalWeight $v.Local)}}<tr><th>Consul weights (this node / all)</th><td class="num">{{$v.LocalWeight}} / {{$v.TotalWeight}}</td></tr>
{{end}}<tr><th>weight (this replica's share)</th><td class="num"{{if not $i}} id="weight"{{end}}>{{num $v.Weight}} ({{pct $v.Weight}})</td></tr>
<tr><th>held change (--membership-hold)</th><td{{if not $i}} id="pending"{{end}}>{{with $v.Pending}}weight {{num .Weight}} ({{.Total}} replicas, {{.Local}} here) takes effect at {{time .At}}, in {{printf "%.1f" .InSecs}} s, if it holds{{else}}none{{end}}</td></tr>
<tr><th>view confirmed</th><td>{{time $v.ObservedAt}} ({{printf "%.1f" $v.AgeSeconds}} s ago)</td></tr>
<tr><th>last error</th><td{{if $v.LastError}} class="bad"{{end}}>{{or $v.LastError "none"}} ({{$v.Errors}} errors since start)</td></tr>
</table>
{{with $v.Demand}}<p>Shares by demand: {{if .Leading}}this replica divides{{else if .Leader}}divided by {{.Leader}}{{else}}no division yet{{end}}{{if .Leader}}, parameters {{printf "%.1f" .ParamsAgeSeconds}} s old{{if .Stale}} (stale: equal shares){{end}}{{end}}; {{.Writes}} reports written, {{.Errors}} failed.</p>
<table class="demand">
<tr><th>rule</th><th>offered here</th><th>admitted here</th><th>share here</th><th>equal share</th><th>cluster admitted ÷ L</th></tr>
{{range .Rules}}<tr><td>{{.Rule}}{{if .Value}} value <code>{{.Value}}</code>{{end}}</td><td class="num">{{printf "%.4g" .Offered}}/s</td><td class="num">{{printf "%.4g" .Admitted}}/s</td><td class="num">{{num .Share}} ({{pct .Share}})</td><td class="num">{{num .Equal}}</td><td class="num">{{printf "%.3f" .ClusterAdmittedRatio}}</td></tr>
{{end}}</table>
{{if .Division}}<p>This replica leads: its last division, every replica's demand and share (busiest first, at most 64 per rule; for a per-value rule, per hot value, the busiest values first).</p>
<table class="division">
<tr><th>rule</th><th>node</th><th>units</th><th>offered</th><th>admitted</th><th>share</th></tr>
{{range .Division}}<tr><td>{{.Rule}}{{if .Value}} value <code>{{.Value}}</code>{{end}}</td><td>{{.Node}}</td><td class="num">{{.Units}}</td><td class="num">{{printf "%.4g" .Offered}}/s</td><td class="num">{{printf "%.4g" .Admitted}}/s</td><td class="num">{{if .Absent}}equal (no report){{else}}{{num .Share}} ({{pct .Share}}){{end}}</td></tr>
{{end}}</table>{{end}}
{{end}}{{end}}<h2>Config</h2>
<table id="config">
<tr><th>source</th><td id="config-source">{{.Reload.Source.Kind}}: {{.Reload.Source.Location}}</td></tr>
{{with .Reload.Source}}{{if eq .Kind "xds"}}<tr><th>xDS stream</th><td{{if not .Connected}} class="bad"{{end}}>{{if .Connected}}connected since {{time .ConnectedSince}}{{else}}disconnected{{if .LastError}}: {{.LastError}}{{end}}{{end}}</td></tr>
<tr><th>xDS version in force</th><td id="xds-version">{{or .Version "none yet"}} ({{.Updates}} updates)</td></tr>
<tr><th>last NACK</th><td{{if .LastNack}} class="bad"{{end}} id="xds-nack">{{with .LastNack}}version {{.Version}} at {{time .At}}: {{.Error}}{{else}}none{{end}} ({{.Nacks}} since start)</td></tr>
{{end}}{{end}}<tr><th>generation</th><td class="num" id="generation">{{.Reload.Generation}}</td></tr>
<tr><th>loaded</th><td>{{time .Reload.LoadedAt}}</td></tr>
<tr><th>last reload</th><td{{if .Reload.LastError}} class="bad"{{end}}>{{if .Reload.LastError}}failed: {{.Reload.LastError}}{{else}}ok{{end}}</td></tr>
<tr><th>files</th><td>{{range .Reload.Files}}{{.}}<br>{{end}}</td></tr>
</table>
<h2>Buckets</h2>
<table id="buckets">
<tr><th>live</th><td class="num" id="live">{{.Buckets}}</td></tr>
<tr><th>cap (--max-buckets)</th><td class="num">{{.MaxBuckets}}</td></tr>
<tr><th>decisions sent to overflow buckets</th><td class="num{{if .Overflowed}} bad{{end}}" id="overflowed">{{.Overflowed}}</td></tr>
{{with .JoinRamp}}<tr><th>join ramp</th><td id="join-ramp">in progress: new buckets start emptier than full ({{printf "%.1f" .ElapsedSeconds}} s in, over in {{printf "%.1f" .EndsInSeconds}} s); {{.Rejected}} first draws refused, {{.WithheldTokens}} tokens held back</td></tr>{{end}}
</table>
<h2>Rules</h2>
<table id="rules">
<tr><th>rule</th><th>limit</th><th class="num">cluster rate /s</th><th class="num">cluster burst</th><th class="num">local share /s</th><th class="num">local burst</th><th>notes</th></tr>
{{range .Rules}}<tr><td>{{.Rule}}</td><td>{{.Limit}}</td>{{if .Unlimited}}<td colspan="4"></td>{{else}}<td class="num">{{num .ClusterRate}}</td><td class="num">{{.ClusterBurst}}</td><td class="num">{{num .LocalRate}}</td><td class="num">{{num .LocalBurst}}</td>{{end}}<td>{{if eq .Share "replica"}}per replica (not divided) {{else if .Service}}service {{.Service}} {{end}}{{if .PerValue}}per value {{end}}{{if .ShadowMode}}shadow {{end}}{{if .RampSeconds}}join ramp over {{printf "%.3g" .RampSeconds}} s {{end}}{{if .BelowOneToken}}<span class="bad">share below 1, floored</span>{{end}}</td></tr>
{{end}}</table>
<h2>Over limit in the last minute (sampled)</h2>
{{if .TopOverLimit}}<table id="overlimit"><tr><th>rule</th><th>descriptor</th><th class="num">samples</th></tr>
{{range .TopOverLimit}}<tr><td>{{.Rule}}</td><td>{{.Value}}</td><td class="num">{{.Samples}}</td></tr>
{{end}}</table>{{else}}<p id="overlimit">none</p>{{end}}
</body></html>
`))
}

// statusPage renders the status page at /.
func (a *Admin) statusPage(w http.ResponseWriter, _ *http.Request) {
	st := Status{Config: a.Snapshot(), Version: a.version, GeneratedAt: time.Now(), TopOverLimit: a.metrics.overLimit.top(20, topWindow)}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := a.page.Execute(w, st); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}
