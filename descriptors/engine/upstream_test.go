package engine

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// TestUpstreamRequests decides the requests of every case of
// descriptors/testdata/upstream that has a requests.txt (see the rules'
// TestUpstreamConfigCases): one request a line, "<domain> key=value ...
// [!limit=N/unit] => <answer>", the answer written from the assertions of
// upstream's test/config/config_test.go.
func TestUpstreamRequests(t *testing.T) {
	// The cases upstream loads with mergeDomainConfigs=true.
	merged := map[string]bool{"domain_merge": true, "duplicate_key_domain_merge": true}
	reqs, err := filepath.Glob("../testdata/upstream/*/requests.txt")
	if err != nil || len(reqs) == 0 {
		t.Fatalf("no requests.txt in ../testdata/upstream: %v", err)
	}
	for _, path := range reqs {
		dir := filepath.Dir(path)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			t.Parallel()
			set, err := compileFilesWith(t, descriptors.CompileOptions{MergeDomains: merged[filepath.Base(dir)]}, dir)
			if err != nil {
				t.Fatalf("%s: requests for a config we reject: %v", path, err)
			}
			checkUpstreamRequests(t, path, set)
		})
	}
}

// checkUpstreamRequests decides each request of a requests.txt on a fresh
// engine with the set and compares the answer with the line's.
func checkUpstreamRequests(t *testing.T, path string, set *descriptors.Set) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	e := newEngine(t, set, bucket.NewStore(0), Options{})
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		req, want, ok := strings.Cut(line, " => ")
		if !ok {
			t.Fatalf("%s:%d: no \" => \" in %q", path, n, line)
		}
		domain, d := upstreamRequest(t, fmt.Sprintf("%s:%d", path, n), req)
		if got := upstreamAnswer(e, domain, d); got != want {
			t.Errorf("%s:%d: %s\n  got  %s\n  want %s", path, n, req, got, want)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
}

// upstreamRequest reads "<domain> key=value ... [!limit=N/unit]".
func upstreamRequest(t *testing.T, where, req string) (string, *commonv3.RateLimitDescriptor) {
	t.Helper()
	fields := strings.Fields(req)
	var kvs []string
	var limit *commonv3.RateLimitDescriptor_RateLimitOverride
	for _, f := range fields[1:] {
		spec, isLimit := strings.CutPrefix(f, "!limit=")
		if !isLimit {
			kvs = append(kvs, f)
			continue
		}
		rpu, unit, _ := strings.Cut(spec, "/")
		n, err := strconv.ParseUint(rpu, 10, 32)
		u, ok := descriptors.ParseUnit(unit)
		if err != nil || !ok {
			t.Fatalf("%s: bad override %q", where, f)
		}
		limit = &commonv3.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: uint32(n), Unit: typev3.RateLimitUnit(u)}
	}
	return fields[0], &commonv3.RateLimitDescriptor{Entries: entries(kvs...), Limit: limit}
}

// upstreamAnswer is what a decision says about the things upstream's GetLimit
// returns: "none" for no limit (upstream's nil), else the limit, then its
// name, "shadow", "override", the stats key and the metadata, when there.
func upstreamAnswer(e *Engine, domain string, d *commonv3.RateLimitDescriptor) string {
	sts, _, err := decide(e, domain, descs(d), 0, 0, nil)
	if err != nil {
		return "invalid: " + err.Error()
	}
	st := sts[0]
	if st.Limit == nil {
		return "none"
	}
	parts := []string{st.Limit.String()}
	if name := st.Limit.Name(); name != "" {
		parts = append(parts, "name="+name)
	}
	if st.Override {
		parts = append(parts, "override")
	}
	if r := st.Rule; r != nil {
		if r.ShadowMode() {
			parts = append(parts, "shadow")
		}
		parts = append(parts, "stats="+string(r.AppendMetricKey(nil, d.Entries)))
		if md := r.Metadata(); len(md) > 0 {
			j, _ := json.Marshal(md)
			parts = append(parts, "metadata="+string(j))
		}
	}
	return strings.Join(parts, " ")
}
