package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

func TestMainUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--bogus"}, "flag provided but not defined: -bogus"},
		{"bad duration", []string{"--duration=soon"}, "invalid value"},
		{"positional argument", []string{"extra"}, `unexpected argument "extra"`},
		{"unbounded", []string{"--duration=0"}, "both are zero"},
		{"duration too long", []string{"--duration=2h"}, "duration: 2h0m0s is outside"},
		{"bad shape", []string{"--shape=square"}, `"square" is not one of`},
		{"cardinality too high", []string{"--cardinality=20000000"}, "cardinality: 20000000 is outside"},
		{"zero cardinality", []string{"--cardinality=0"}, "cardinality: must be at least 1"},
		{"zero conns", []string{"--conns=0"}, "conns: must be at least 1"},
		{"negative rate", []string{"--rate=-1"}, "rate: -1 is outside"},
		{"too many descriptors", []string{"--descriptors=1000"}, "descriptors: 1000 is outside"},
		{"empty target", []string{"--target="}, "target: none given"},
		{"empty domain", []string{"--domain="}, "domain: empty"},
		{"hits addend overflow", []string{"--hits-addend=5000000000"}, "does not fit in 32 bits"},
		{"several problems at once", []string{"--rate=-1", "--warmup=1h"}, "warmup: 1h0m0s is outside"},
		{"bad progress", []string{"--progress=maybe"}, "want true, false or auto"},
		{"compare without b", []string{"--target-a=127.0.0.1:1"}, "target-b: none given"},
		{"compare with --target", []string{"--target-a=x", "--target-b=y", "--target=z"}, "--target: not used in compare mode"},
		{"compare flag alone", []string{"--rounds=3"}, "--rounds: only with --target-a and --target-b"},
		{"zero rounds", []string{"--target-a=x", "--target-b=y", "--rounds=0"}, "rounds: must be at least 1"},
		{"noop with load flags", []string{"--serve-noop=127.0.0.1:0", "--rate=5"}, "--rate: --serve-noop runs a server"},
		{"mix with descriptors", []string{"--shape=mix", "--descriptors=3"}, "shape mix sends its own"},
		{"noop server without serve-noop", []string{"--noop-server=plain"}, "--noop-server: only with --serve-noop"},
		{"unknown noop server", []string{"--serve-noop=127.0.0.1:0", "--noop-server=fast"}, `"fast" is not one of tuned, plain`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := Main(context.Background(), tc.args, &stdout, &stderr)
			if code != 2 {
				t.Fatalf("exit %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("stderr does not mention %q:\n%s", tc.want, stderr.String())
			}
			if stdout.Len() != 0 {
				t.Fatalf("stdout not empty on a usage error: %s", stdout.String())
			}
		})
	}
}

func TestMainHelp(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	if code := Main(context.Background(), []string{"-h"}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d, want 0", code)
	}
	for _, want := range []string{"--serve-noop ADDR", "-target-a", "-cardinality", "SHARELIMIT_"} {
		if !strings.Contains(stderr.String(), want) {
			t.Errorf("usage does not mention %q", want)
		}
	}
}

func TestMainRunFailure(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := Main(context.Background(), []string{"--target=unix:/nonexistent/rls.sock", "--requests=10", "--warmup=0"}, &stdout, &stderr)
	if code != 1 || !strings.Contains(stderr.String(), "probe unix:/nonexistent/rls.sock") {
		t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
	}
}

// startNoopMain runs `bench --serve-noop` until the test ends and returns the
// address it printed.
func startNoopMain(t *testing.T, addr string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var stdout, stderr testutil.Buffer
	code := make(chan int, 1)
	go func() { code <- Main(ctx, []string{"--serve-noop", addr, "--json"}, &stdout, &stderr) }()
	t.Cleanup(func() {
		cancel()
		if c := <-code; c != 0 {
			t.Errorf("serve-noop exit %d: %s", c, stderr.String())
		}
	})
	var out struct {
		Addr string `json:"serve_noop"`
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := json.Unmarshal([]byte(stdout.String()), &out); err != nil || out.Addr == "" {
			return fmt.Errorf("serve-noop printed no address; stdout %q, stderr %q", stdout.String(), stderr.String())
		}
		return nil
	})
	return out.Addr
}

func TestMainEndToEnd(t *testing.T) {
	t.Parallel()
	tcp := startNoopMain(t, "127.0.0.1:0")
	unix := startNoopMain(t, "unix:"+t.TempDir()+"/noop.sock")
	if !strings.HasPrefix(unix, "unix:/") {
		t.Fatalf("unix noop address %q", unix)
	}
	tests := []struct {
		name  string
		args  []string
		check func(t *testing.T, stdout string)
	}{
		{
			name: "json over two targets",
			args: []string{"--target", tcp + "," + unix, "--requests=500", "--warmup=0", "--json", "--shape=remote_address", "--cardinality=1000"},
			check: func(t *testing.T, stdout string) {
				var res Result
				if err := json.Unmarshal([]byte(stdout), &res); err != nil {
					t.Fatalf("JSON output does not parse: %v\n%s", err, stdout)
				}
				if res.Requests != 500 || res.OK != 500 || len(res.Targets) != 2 || res.Shape != ShapeRemoteAddress {
					t.Fatalf("result %+v", res)
				}
			},
		},
		{
			name: "table, open loop",
			args: []string{"--target", tcp, "--rate=1000", "--duration=200ms", "--warmup=50ms", "--progress=false"},
			check: func(t *testing.T, stdout string) {
				for _, want := range []string{"open loop at 1000 req/s", "req/s", "p99.9", "late", "client cpu"} {
					if !strings.Contains(stdout, want) {
						t.Errorf("table lacks %q:\n%s", want, stdout)
					}
				}
			},
		},
		{
			name: "compare",
			args: []string{"--target-a", tcp, "--target-b", unix, "--label-a=noop", "--label-b=noop-unix", "--rounds=1", "--requests=200", "--warmup=0"},
			check: func(t *testing.T, stdout string) {
				for _, want := range []string{"A: noop = " + tcp, "B/A", "median  noop-unix"} {
					if !strings.Contains(stdout, want) {
						t.Errorf("table lacks %q:\n%s", want, stdout)
					}
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			if code := Main(context.Background(), tc.args, &stdout, &stderr); code != 0 {
				t.Fatalf("exit %d; stderr:\n%s", code, stderr.String())
			}
			tc.check(t, stdout.String())
		})
	}
}

// TestMainReadsInjectedEnv checks that bench reads its flags through getenv with
// serve's rule: a bad value is a usage error naming its variable, a flag wins,
// and an empty variable counts as unset rather than as an empty value.
func TestMainReadsInjectedEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    string
		notWant []string
	}{
		{name: "bad value", env: map[string]string{"SHARELIMIT_CONNS": "many"}, want: "SHARELIMIT_CONNS"},
		{name: "value checked like its flag", env: map[string]string{"SHARELIMIT_RATE": "-1"}, want: "rate: -1 is outside"},
		{name: "flag wins", args: []string{"--rate=-1"}, env: map[string]string{"SHARELIMIT_RATE": "5"}, want: "rate: -1 is outside"},
		{
			name:    "empty is unset",
			env:     map[string]string{"SHARELIMIT_RATE": "-1", "SHARELIMIT_TARGET": "", "SHARELIMIT_DOMAIN": ""},
			want:    "rate: -1 is outside",
			notWant: []string{"target: none given", "domain: empty"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := benchMain(context.Background(), tc.args, func(k string) string { return tc.env[k] }, &stdout, &stderr)
			if code != 2 {
				t.Fatalf("exit %d, want 2; stderr:\n%s", code, stderr.String())
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("stderr does not mention %q:\n%s", tc.want, stderr.String())
			}
			for _, no := range tc.notWant {
				if strings.Contains(stderr.String(), no) {
					t.Errorf("stderr mentions %q:\n%s", no, stderr.String())
				}
			}
		})
	}
}

func TestApplyEnv(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		"SHARELIMIT_RATE":        "250",
		"SHARELIMIT_HITS_ADDEND": "7",
		"SHARELIMIT_DOMAIN":      "from-env",
	}
	getenv := func(k string) string { return env[k] }
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var o options
	o.register(fs)
	if err := fs.Parse([]string{"--domain=from-flag"}); err != nil {
		t.Fatal(err)
	}
	if err := config.ApplyEnv(fs, getenv); err != nil {
		t.Fatal(err)
	}
	if o.rate != 250 || o.hitsAddend != 7 || o.domain != "from-flag" {
		t.Fatalf("rate %g, hits_addend %d, domain %q: want 250, 7 from the environment and the flag's domain", o.rate, o.hitsAddend, o.domain)
	}
	env["SHARELIMIT_CONNS"] = "many"
	if err := config.ApplyEnv(fs, getenv); err == nil || !strings.Contains(err.Error(), "SHARELIMIT_CONNS") {
		t.Fatalf("bad environment value: %v, want an error naming SHARELIMIT_CONNS", err)
	}
}
