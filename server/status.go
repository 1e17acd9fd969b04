package server

import (
	_ "embed"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/sharelimit/sharelimit/internal/human"
)

// The page and its style sheet are files of their own, embedded, so the
// markup reads as markup. The style sheet is served from /status.css rather
// than inlined: the page's Content-Security-Policy then allows styles from
// its own origin only, and no inline script or style at all.
var (
	//go:embed status.html
	statusHTML string
	//go:embed status.css
	statusCSS []byte
)

// statusCSP is the status page's Content-Security-Policy. Nothing runs:
// with default-src 'none' and no script-src, no script may load or run,
// inline or not. The style sheet comes from this origin; the favicon is an
// empty data: URL, so the browser asks for nothing else. The sparklines are
// inline SVG, drawn with presentation attributes, which CSP does not govern.
const statusCSP = "default-src 'none'; style-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// The page stays a bounded size with any config: the rules table is cut
// into pages, and the long lists are capped, each saying so.
const (
	rulesPerPage  = 100
	maxDemandRows = 200 // per service: its demand rules plus its division
	maxFiles      = 50
)

// Status is what the status page shows. It is built from the same snapshot as
// /rlconfig, so the two never disagree.
type Status struct {
	RLConfig
	Version      string
	GeneratedAt  time.Time
	TopOverLimit []TopKey
	ViewRows     []ViewRow
	Files        []string
	FilesOmitted int
	// The page of the rules table, 1-based, and its rules.
	Rows                                      []RuleRow
	Page, Pages, PerPage, PrevPage, NextPage  int
	FirstRule, LastRule, TotalRules           int
	Untracked, MaxHistoryRules, MaxDemandRows int
	// PageMarks are the reload and membership marks, drawn once and used by
	// every sparkline (at SparkH tall).
	PageMarks []SparkMark
	SparkH    int
}

// ViewRow is a membership view on the page, its demand rows capped.
type ViewRow struct {
	View
	Omitted int // demand and division rows not shown
}

// RuleRow is a rule on the page, with its last ten minutes.
type RuleRow struct {
	RuleInfo
	Spark *Spark // nil: no history kept for it
}

// topWindow is how far back the status page looks for over-limit keys.
const topWindow = time.Minute

// newStatusPage parses the status page's template. It is built once per Admin,
// not held in a package variable.
func newStatusPage() *template.Template {
	return template.Must(template.New("status").Funcs(template.FuncMap{
		"pct":   human.Share,
		"num":   human.Number,
		"rate":  human.Rate,
		"count": func(n any) string { return countOf(n) },
		"secs":  human.Seconds,
		"join":  func(s []string) string { return strings.Join(s, ", ") },
		"ago":   func(t time.Time) string { return human.Ago(t, time.Now()) },
		"time": func(t time.Time) string {
			if t.IsZero() {
				return "never"
			}
			return t.UTC().Format(time.RFC3339)
		},
	}).Parse(statusHTML))
}

// countOf formats any of the integer types the snapshot uses.
func countOf(n any) string {
	switch n := n.(type) {
	case int:
		return human.Count(uint64(max(n, 0)))
	case uint64:
		return human.Count(n)
	case uint32:
		return human.Count(uint64(n))
	}
	return fmt.Sprint(n)
}

// statusPage renders the status page at /; ?page=N picks the page of rules.
func (a *Admin) statusPage(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	c := a.RLConfig()
	st := Status{RLConfig: c, Version: a.version, GeneratedAt: now, TopOverLimit: a.metrics.overLimit.top(20, topWindow),
		PerPage: rulesPerPage, TotalRules: len(c.Rules), MaxHistoryRules: maxHistoryRules, MaxDemandRows: maxDemandRows}
	for _, v := range append([]View{c.Membership}, c.Services...) {
		st.ViewRows = append(st.ViewRows, capDemand(v))
	}
	st.Files = c.Reload.Files
	if len(st.Files) > maxFiles {
		st.Files, st.FilesOmitted = st.Files[:maxFiles], len(st.Files)-maxFiles
	}
	st.Pages = max(1, (len(c.Rules)+rulesPerPage-1)/rulesPerPage)
	st.Page, _ = strconv.Atoi(r.URL.Query().Get("page"))
	st.Page = min(max(st.Page, 1), st.Pages)
	lo, hi := (st.Page-1)*rulesPerPage, min(st.Page*rulesPerPage, len(c.Rules))
	st.FirstRule, st.LastRule = lo+1, hi
	if st.Page > 1 {
		st.PrevPage = st.Page - 1
	}
	if st.Page < st.Pages {
		st.NextPage = st.Page + 1
	}
	shown := map[ruleKey]bool{}
	for _, ri := range c.Rules[lo:hi] {
		shown[ruleKey{ri.Domain, ri.Rule}] = true
	}
	hist := a.historyAt(now, func(k ruleKey) bool { return shown[k] })
	st.Untracked = hist.Untracked
	byKey := map[ruleKey]*RuleHistory{}
	for i := range hist.Rules {
		byKey[ruleKey{hist.Rules[i].Domain, hist.Rules[i].Rule}] = &hist.Rules[i]
	}
	st.PageMarks, st.SparkH = pageMarks(&hist), sparkH
	for _, ri := range c.Rules[lo:hi] {
		row := RuleRow{RuleInfo: ri}
		if rh := byKey[ruleKey{ri.Domain, ri.Rule}]; rh != nil {
			row.Spark = newSpark(&hist, rh)
		}
		st.Rows = append(st.Rows, row)
	}
	h := w.Header()
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Content-Security-Policy", statusCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	if err := a.page.Execute(w, st); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
	}
}

// capDemand keeps at most maxDemandRows of a view's demand rows, its rules
// first, and counts the rest.
func capDemand(v View) ViewRow {
	d := v.Demand
	if d == nil || len(d.Rules)+len(d.Division) <= maxDemandRows {
		return ViewRow{View: v}
	}
	c := *d
	row := ViewRow{Omitted: len(d.Rules) + len(d.Division) - maxDemandRows}
	c.Rules = c.Rules[:min(len(c.Rules), maxDemandRows)]
	c.Division = c.Division[:min(len(c.Division), maxDemandRows-len(c.Rules))]
	v.Demand = &c
	row.View = v
	return row
}

// statusStyle serves the page's style sheet.
func statusStyle(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Cache-Control", "max-age=300")
	w.Write(statusCSS)
}
