package descriptors

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

// The cases of upstream's test/config/config_test.go (envoyproxy/ratelimit),
// each as a fixture of our own in testdata/upstream/<case>/: one or more YAML
// files, the first of which starts with
//
//	# upstream: TestXxx accepts|rejects
//
// naming the upstream test it mirrors and that test's verdict. A case where
// we deliberately differ says why in a "# differs: ..." line. want.golden
// holds what we do: "reject" and each error as `sharelimit check` prints it,
// or "accept" and the compiled rules. An accepted case may have requests.txt:
// one request a line, "<domain> key=value ... [!limit=N/unit] => <answer>",
// the answer written from upstream's assertions, which the engine's
// TestUpstreamRequests decides.

// upstreamTests are the tests of upstream's config_test.go that check a
// config; each must be mirrored by at least one case.
var upstreamTests = []string{
	"TestBasicConfig", "TestDomainMerge", "TestConfigLimitOverride",
	"TestEmptyDomain", "TestDuplicateDomain", "TestEmptyKey", "TestDuplicateKey",
	"TestDuplicateKeyDomainMerge", "TestBadLimitUnit", "TestReplacesSelf",
	"TestReplacesEmpty", "TestBadYaml", "TestMisspelledKey", "TestNonStringKey",
	"TestNonMapList", "TestUnlimitedWithRateLimitUnit", "TestShadowModeConfig",
	"TestWildcardConfig", "TestDetailedMetric",
	"TestValueToMetric_UsesRuntimeValuesInStats",
	"TestValueToMetric_DefaultKeyIncludesValueAtThatLevel",
	"TestValueToMetric_MidLevelOnly", "TestValueToMetric_NoFlag_Unchanged",
	"TestValueToMetric_DoesNotOverrideDetailedMetric",
	"TestValueToMetric_WithConfiguredValues", "TestValueToMetric_WithWildcard",
	"TestValueToMetric_WithEmptyValue", "TestValueToMetric_FullKeyMatchesStatsKey",
	"TestShareThreshold", "TestWildcardStatsBehavior", "TestMetadata",
}

// upstreamMerged are the cases upstream loads with mergeDomainConfigs=true
// (MERGE_DOMAIN_CONFIG); they compile through compileMerged.
var upstreamMerged = map[string]bool{
	"domain_merge":               true,
	"duplicate_key_domain_merge": true,
}

// compileMerged compiles a case's files with domains merged across files, as
// upstream does with mergeDomainConfigs=true.
func compileMerged(t *testing.T, dir string) (*Set, error) {
	t.Helper()
	return compileFilesWith(t, CompileOptions{MergeDomains: true}, dir)
}

var upstreamHeader = regexp.MustCompile(`^# upstream: (Test\w+) (accepts|rejects)$`)

func TestUpstreamConfigCases(t *testing.T) {
	dirs, err := filepath.Glob("testdata/upstream/*")
	if err != nil {
		t.Fatal(err)
	}
	mirrored := map[string]bool{}
	cases := map[string]bool{}
	for _, dir := range dirs {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			continue
		}
		name := filepath.Base(dir)
		cases[name] = true
		test, verdict, differs := upstreamCaseHeader(t, dir)
		mirrored[test] = true
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			var set *Set
			var err error
			if upstreamMerged[name] {
				set, err = compileMerged(t, dir)
			} else {
				set, err = compileFiles(t, dir)
			}
			ours := "accepts"
			if err != nil {
				ours = "rejects"
			}
			if ours != verdict {
				if differs == "" {
					t.Errorf("upstream %s %s this config, we %s it", test, verdict, strings.TrimSuffix(ours, "s"))
				} else {
					t.Logf("differs from upstream %s (%s): %s", test, verdict, differs)
				}
			}
			var got string
			if err != nil {
				got = "reject\n" + upstreamRejection(t, dir, err)
			} else {
				got = "accept\n" + upstreamRules(set)
			}
			testutil.Golden(t, filepath.Join(dir, "want.golden"), got)
			reqs := filepath.Join(dir, "requests.txt")
			if _, statErr := os.Stat(reqs); statErr == nil {
				if err != nil {
					t.Fatalf("%s: requests for a config we reject", reqs)
				}
				// The engine's tests decide them (TestUpstreamRequests).
			}
		})
	}
	for _, test := range upstreamTests {
		if !mirrored[test] {
			t.Errorf("no case in testdata/upstream mirrors upstream's %s", test)
		}
	}
	for test := range mirrored {
		if !slices.Contains(upstreamTests, test) {
			t.Errorf("a case names %s, which is not among upstreamTests", test)
		}
	}
	for name := range upstreamMerged {
		if !cases[name] {
			t.Errorf("upstreamMerged names %s, which is not a case", name)
		}
	}
}

// upstreamCaseHeader reads the first YAML file of a case: its first line names
// the upstream test and verdict; a "# differs:" comment line, if any, says
// why we differ (continuation comment lines are joined to it).
func upstreamCaseHeader(t *testing.T, dir string) (test, verdict, differs string) {
	t.Helper()
	files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if len(files) == 0 {
		t.Fatalf("%s: no YAML files", dir)
	}
	sort.Strings(files)
	data, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(data), "\n")
	m := upstreamHeader.FindStringSubmatch(lines[0])
	if m == nil {
		t.Fatalf("%s: first line %q, want \"# upstream: TestXxx accepts|rejects\"", files[0], lines[0])
	}
	var why []string
	for _, l := range lines[1:] {
		switch {
		case strings.HasPrefix(l, "# differs:"):
			why = append(why, strings.TrimSpace(strings.TrimPrefix(l, "# differs:")))
		case len(why) > 0 && strings.HasPrefix(l, "# "):
			why = append(why, strings.TrimPrefix(l, "# "))
		case len(why) > 0:
			return m[1], m[2], strings.Join(why, " ")
		}
	}
	return m[1], m[2], strings.Join(why, " ")
}

// upstreamRejection is a refused config's errors, one a line, as `sharelimit
// check` prints them. Each must be an *Error positioned in one of the case's
// files.
func upstreamRejection(t *testing.T, dir string, err error) string {
	t.Helper()
	errs := Errors(err)
	if len(errs) == 0 {
		t.Fatalf("error carries no position: %v", err)
	}
	var b strings.Builder
	for _, e := range errs {
		if filepath.Dir(e.Pos.File) != dir || e.Pos.Line < 1 || e.Pos.Col < 1 {
			t.Errorf("bad position %v in %q", e.Pos, e)
		}
		b.WriteString(e.Error() + "\n")
	}
	return b.String()
}

// upstreamRules is one line per compiled rule: its path, how it matches, its
// limit and the settings upstream reads, and where it stands.
func upstreamRules(s *Set) string {
	var b strings.Builder
	for _, r := range s.Rules() {
		fmt.Fprintf(&b, "%s%s [%s]", strings.Repeat("  ", r.Depth()-1), r.Path(), r.Kind())
		if l := r.Limit(); l != nil {
			fmt.Fprintf(&b, " limit=%q", l.String())
			if l.Name() != "" {
				fmt.Fprintf(&b, " name=%s", l.Name())
			}
			if rep := l.Replaces(); len(rep) > 0 {
				fmt.Fprintf(&b, " replaces=%s", strings.Join(rep, ","))
			}
		}
		for _, f := range []struct {
			on   bool
			name string
		}{
			{r.ShadowMode(), "shadow_mode"}, {r.QuotaMode(), "quota_mode"},
			{r.DetailedMetric(), "detailed_metric"}, {r.ValueToMetric(), "value_to_metric"},
			{r.ShareThreshold(), "share_threshold"},
		} {
			if f.on {
				b.WriteString(" " + f.name)
			}
		}
		if md := r.Metadata(); len(md) > 0 {
			j, _ := json.Marshal(md) // map keys sorted
			fmt.Fprintf(&b, " metadata=%s", j)
		}
		fmt.Fprintf(&b, " @%s:%d:%d\n", filepath.Base(r.Pos().File), r.Pos().Line, r.Pos().Col)
	}
	return b.String()
}
