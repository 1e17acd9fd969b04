package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/internal/testutil"
	"github.com/sharelimit/sharelimit/loadgen"
)

func golden(t *testing.T, name, got string) {
	t.Helper()
	testutil.Golden(t, filepath.Join("testdata", name+".golden"), got)
}

func runCLI(args ...string) (int, string) {
	var out bytes.Buffer
	code := run(context.Background(), append([]string{"sharelimit"}, args...), &out, &out)
	return code, out.String()
}

func TestCLIGolden(t *testing.T) {
	cases := []struct {
		name string
		args []string
		code int
	}{
		{"check_ok", []string{"check", "../../examples/config"}, 0},
		{"check_warnings", []string{"check", "--replicas", "40", "-q", "../../examples/config"}, 0},
		{"simulate_hot", []string{"simulate", "--replicas", "4", "--duration", "12s"}, 0},
		{"simulate_bad_events", []string{"simulate", "--events", "10s:0"}, 2},
		{"simulate_bad_config", []string{"simulate", "--replicas", "0", "--shape", "square"}, 2},
		{"check_warnings_demand", []string{"check", "--replicas", "1000", "-q", "../../descriptors/testdata/valid/share.yaml"}, 0},
		{"check_errors", []string{"check", "../../descriptors/testdata/invalid/many_errors.yaml", "../../descriptors/testdata/invalid/bad_unit.yaml"}, 1},
		{"check_usage", []string{"check"}, 2},
		{"check_merge_refused", []string{"check", "../../descriptors/testdata/mergedomain/ok"}, 1},
		{"check_merge", []string{"check", "--merge-domain-config", "-v", "../../descriptors/testdata/mergedomain/ok"}, 0},
		{"check_merge_duplicate", []string{"check", "--merge-domain-config", "../../descriptors/testdata/mergedomain/dup"}, 1},
		{"explain_nested", []string{"explain", "--config-dir", "../../examples/config", "--domain", "edge", "--replicas", "4", "header_match=login", "remote_address=10.1.2.3"}, 0},
		{"explain_too_deep", []string{"explain", "--config-dir", "../../examples/config", "--domain", "edge", "generic_key=api", "remote_address=10.1.2.3"}, 0},
		{"explain_parent_no_fallback", []string{"explain", "--config-dir", "../../examples/config", "--domain", "edge", "header_match=login"}, 0},
		{"explain_no_rule", []string{"explain", "--config-dir", "../../examples/config", "--domain", "edge", "user=alice"}, 0},
		{"explain_unknown_domain", []string{"explain", "--config-dir", "../../examples/config", "--domain", "nope", "a=b"}, 0},
		{"explain_replaces", []string{"explain", "--config-dir", "../../descriptors/testdata/valid/edge_proxy.yaml", "--domain", "edge_proxy_per_ip", "--weight", "0.1",
			"path=/api/v1/x", "+", "path=/api/v2/admin/users"}, 0},
		{"explain_empty_value", []string{"explain", "--config-dir", "../../examples/config", "--domain", "edge", "remote_address="}, 0},
		{"check_share", []string{"check", "-v", "--replicas", "200", "../../descriptors/testdata/valid/share.yaml"}, 0},
		{"explain_share_demand", []string{"explain", "--config-dir", "../../descriptors/testdata/valid/share.yaml", "--domain", "backend", "--replicas", "4", "checkout=all"}, 0},
		{"explain_share_replica", []string{"explain", "--config-dir", "../../descriptors/testdata/valid/share.yaml", "--domain", "backend", "--replicas", "4", "backend_guard=db1"}, 0},
		{"explain_bucket", []string{"explain", "--config-dir", "../../examples/config", "--domain", "edge", "--replicas", "4", "--bucket", "remote_address=10.1.2.3", "header_match=login"}, 0},
		{"explain_bucket_second_order", []string{"explain", "--config-dir", "../../descriptors/testdata/bucketid/rules.yaml", "--domain", "rlqs", "--bucket", "user=bob", "plan=free"}, 0},
		{"explain_bucket_no_rule", []string{"explain", "--config-dir", "../../descriptors/testdata/bucketid/rules.yaml", "--domain", "rlqs", "--bucket", "user=bob", "plan=gold"}, 0},
		{"explain_bucket_no_limit", []string{"explain", "--config-dir", "../../descriptors/testdata/bucketid/rules.yaml", "--domain", "rlqs", "--bucket", "tenant=t1"}, 0},
		{"explain_bucket_duplicate_key", []string{"explain", "--config-dir", "../../examples/config", "--domain", "edge", "--bucket", "a=1", "a=2"}, 2},
		{"unknown_command", []string{"frobnicate"}, 2},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, out := runCLI(tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d:\n%s", code, tc.code, out)
			}
			golden(t, tc.name, out)
		})
	}
}

func TestVersion(t *testing.T) {
	code, out := runCLI("version")
	if code != 0 || !strings.HasPrefix(out, "sharelimit ") {
		t.Fatalf("%d %q", code, out)
	}
}

func TestServeRejectsInvalidConfigWithEveryError(t *testing.T) {
	dir := t.TempDir()
	b, _ := os.ReadFile("../../descriptors/testdata/invalid/many_errors.yaml")
	os.WriteFile(filepath.Join(dir, "bad.yaml"), b, 0o644)
	var out bytes.Buffer
	code := serve(context.Background(), []string{"--config-dir", dir, "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, nil, false, &out)
	if code != 1 || strings.Count(out.String(), "bad.yaml:") != 4 {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
}

// TestREADMEListsEveryFlag keeps the README's settings table honest: every flag
// and its variable appear, and every flag the README names exists.
func TestREADMEListsEveryFlag(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	known := map[string]bool{}
	config.Defaults().FlagSet("serve").VisitAll(func(f *flag.Flag) {
		known[f.Name] = true
		if !strings.Contains(text, "| `--"+f.Name+"` | `"+config.EnvName(f.Name)+"` |") {
			t.Errorf("README's settings table lacks --%s / %s", f.Name, config.EnvName(f.Name))
		}
	})
	// The other commands' flags may be named too.
	simFlags, _, _, _ := simulateFlags()
	simFlags.VisitAll(func(f *flag.Flag) { known[f.Name] = true })
	loadgen.FlagSet().VisitAll(func(f *flag.Flag) { known[f.Name] = true })
	for _, m := range regexp.MustCompile("`--([a-z][a-z0-9-]+)").FindAllStringSubmatch(text, -1) {
		if !known[m[1]] && !map[string]bool{"replicas": true, "weight": true, "config-dir": true, "domain": true}[m[1]] {
			t.Errorf("README names --%s, which no command has", m[1])
		}
	}
	ci, _ := os.ReadFile("../../.ci/run")
	if !strings.Contains(string(ci), "make test") || !strings.Contains(text, "make test") {
		t.Error(".ci/run must run the README's test command, make test")
	}
}

// TestREADMEListsEveryUpstreamVariable: the migration table names every
// variable of upstream's settings that the daemon reads or ignores, from the
// same list the daemon uses, so the table cannot drift from the code.
func TestREADMEListsEveryUpstreamVariable(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	start := strings.Index(text, "## Migrating from upstream")
	if start < 0 {
		t.Fatal("README has no migration section")
	}
	section := text[start:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	for _, v := range config.UpstreamVariables() {
		row := regexp.MustCompile("(?m)^\\|.*`" + regexp.QuoteMeta(v.Name) + "`.*\\| (ignored|`[^|]*`) \\|")
		if !row.MatchString(section) {
			t.Errorf("README's migration table lacks %s", v.Name)
			continue
		}
		if v.To != config.UpstreamIgnored && !strings.Contains(section, "| `"+v.Name+"` | `"+v.To+"` |") {
			t.Errorf("README's migration table does not map %s to %s", v.Name, v.To)
		}
	}
}

func TestHealthcheckCommand(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthcheck" {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(status)
		io.WriteString(w, "OK")
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	var out bytes.Buffer
	if code := healthcheck(context.Background(), []string{"--http-addr", addr}, func(string) string { return "" }, &out, &out); code != 0 {
		t.Fatalf("healthy: exit %d %s", code, out.String())
	}
	// The address also comes from the daemon's own variable.
	env := func(k string) string { return map[string]string{"SHARELIMIT_HTTP_ADDR": addr}[k] }
	status = http.StatusServiceUnavailable
	if code := healthcheck(context.Background(), nil, env, &out, &out); code != 1 {
		t.Fatalf("draining: exit %d", code)
	}
	// And from upstream's HOST and PORT, as a container moving from upstream
	// keeps them; 0.0.0.0 is reached on loopback.
	status = http.StatusOK
	_, port, _ := net.SplitHostPort(addr)
	upstream := func(k string) string { return map[string]string{"HOST": "0.0.0.0", "PORT": port}[k] }
	if code := healthcheck(context.Background(), nil, upstream, &out, &out); code != 0 {
		t.Fatalf("upstream's HOST and PORT: exit %d %s", code, out.String())
	}
	srv.Close()
	if code := healthcheck(context.Background(), []string{"--http-addr", addr, "--timeout", "200ms"}, env, &out, &out); code != 1 {
		t.Fatalf("down: exit %d", code)
	}
}

func TestHelpIsNotServe(t *testing.T) {
	for _, arg := range []string{"-h", "--help", "help"} {
		if code, out := runCLI(arg); code != 0 || !strings.Contains(out, "usage:") {
			t.Errorf("%s: exit %d %q", arg, code, out)
		}
	}
}

// TestServeHelpExitsZero: asking serve for its flags is not a usage error.
func TestServeHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{{"serve", "--help"}, {"serve", "-h"}} {
		if code, out := runCLI(args...); code != 0 || !strings.Contains(out, "-config-dir") {
			t.Errorf("%v: exit %d %q", args, code, out)
		}
	}
	if code, _ := runCLI("serve", "--no-such-flag"); code != 2 {
		t.Errorf("an unknown flag: exit %d, want 2", code)
	}
}
