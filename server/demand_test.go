package server

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sharelimit/sharelimit/descriptors"
)

// TestDemandOnTheAdminPages: a service's demand sharing shows on /rlconfig
// and the status page, the leader's division too; a node name from a report
// (written by another replica) is escaped on the page.
func TestDemandOnTheAdminPages(t *testing.T) {
	set, err := descriptors.Compile(descriptors.File{Name: "a.yaml", Data: []byte("domain: a\ndescriptors:\n  - key: k\n    value: v\n    rate_limit: {unit: second, requests_per_unit: 400, share: demand}\n")})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixtureSet(t, Options{}, 0.25, set)
	views := []View{{Source: "consul", Service: "web", Total: 4, Local: 1, TotalWeight: 4, LocalWeight: 1, Weight: 0.25,
		Demand: &DemandStatus{Leading: true, Leader: "node-a", ParamsAgeSeconds: 0.4, Writes: 12,
			Rules: []DemandRule{{Rule: "a.k_v", Offered: 640, Admitted: 230, Share: 0.575, Equal: 0.25, ClusterAdmittedRatio: 0.98}},
			Division: []DemandReplica{
				{Rule: "a.k_v", Node: "node-a", Units: 1, Offered: 640, Admitted: 230, Share: 0.575},
				{Rule: "a.k_v", Node: "<script>alert(1)</script>", Units: 1, Offered: 53, Admitted: 53, Share: 0.14},
				{Rule: "a.k_v", Node: "node-c", Units: 1, Absent: true, Share: 0.25},
			},
			Counted: "not counted", WriteError: "held: consulkv: write refused",
			BadReports: []DemandBadReport{{Node: "<b>node-d</b>", Cause: "undecodable", Error: "demand: bad encoding: checksum mismatch"}},
		}}}
	a := NewAdmin(f.svc, f.engine, f.metrics, func() []View { return views }, func() ReloadStatus { return ReloadStatus{} })
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	_, text := get(t, srv.URL+"/rlconfig")
	for _, want := range []string{
		`demand: leading=true leader="node-a" params_age=0.4 s stale=false writes=12 write_errors=0`,
		`demand a.k_v: offered 640 per second, admitted 230 per second, share=0.575 equal=0.25 cluster_admitted_ratio=0.980`,
		`divided a.k_v: node=node-a units=1 offered 640 per second, admitted 230 per second, share=0.575`,
		`divided a.k_v: node=node-c units=1 offered 0 per second, admitted 0 per second, share=0.25 absent`,
		`write_errors=0 report="not counted" write_error="held: consulkv: write refused"`,
		`demand report unusable: node="<b>node-d</b>" cause=undecodable: "demand: bad encoding: checksum mismatch"`,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/rlconfig lacks %q:\n%s", want, text)
		}
	}
	_, page := get(t, srv.URL+"/")
	for _, want := range []string{
		`Shares by demand: this replica divides, parameters 0.4 s old; 12 reports written, 0 failed.`,
		`<td>a.k_v</td><td class="num">640 per second</td><td class="num">230 per second</td>`,
		`&lt;script&gt;alert(1)&lt;/script&gt;`,
		`equal (no report)`,
		`not counted: at most its equal share`,
		`Its report cannot be written: held: consulkv: write refused`,
		`&lt;b&gt;node-d&lt;/b&gt; (undecodable: demand: bad encoding: checksum mismatch)`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("status page lacks %q", want)
		}
	}
	if strings.Contains(page, "<script>alert") {
		t.Error("a node name from a report reached the page unescaped")
	}
}
