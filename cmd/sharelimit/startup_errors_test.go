package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestStartupErrorsAreOneRecord: every error that stops the start is one log
// record in the configured format: every line of stderr parses as JSON with
// LOG_FORMAT=json, whatever failed, and exactly one of them is the ERROR,
// naming what failed (file:line:col for the config).
func TestStartupErrorsAreOneRecord(t *testing.T) {
	bad := t.TempDir()
	b, err := os.ReadFile("../../descriptors/testdata/invalid/many_errors.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "bad.yaml"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	good := t.TempDir()
	if err := os.WriteFile(filepath.Join(good, "r.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	loopback := []string{"--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}

	for _, tc := range []struct {
		name    string
		args    []string
		environ []string
		code    int
		want    []string // in the ERROR record
		// upstream: the environment is upstream's, so the records carry
		// upstream's field names
		upstream bool
	}{
		{"unknown flag, JSON from LOG_FORMAT", []string{"--no-such-flag"}, []string{"LOG_FORMAT=json"}, 2, []string{"flag provided but not defined: -no-such-flag"}, false},
		{"unknown flag, JSON from the flag", []string{"--log-format", "json", "--nope"}, nil, 2, []string{"-nope"}, false},
		{"unknown flag, JSON from SHARELIMIT_LOG_FORMAT", []string{"-log-format=xml", "--nope"}, []string{"SHARELIMIT_LOG_FORMAT=json"}, 2, []string{"-nope"}, false},
		{"bad upstream value", nil, []string{"LOG_FORMAT=json", "GRPC_PORT=eighty"}, 2, []string{"GRPC_PORT", "eighty"}, true},
		{"invalid config in upstream's environment", append([]string{"--config-dir", bad}, loopback...), []string{"LOG_FORMAT=json", "REDIS_URL=redis:6379"}, 1,
			[]string{filepath.Join(bad, "bad.yaml") + ":"}, true},
		{"invalid settings", append([]string{"--replicas", "0", "--config-dir", "/no/such/dir"}, loopback...), []string{"LOG_FORMAT=json"}, 2,
			[]string{"--replicas: must be at least 1", "/no/such/dir"}, false},
		{"invalid config", append([]string{"--config-dir", bad}, loopback...), []string{"LOG_FORMAT=json"}, 1,
			[]string{filepath.Join(bad, "bad.yaml") + ":"}, false},
		{"address in use", []string{"--config-dir", good, "--grpc-addr", busy.Addr().String(), "--http-addr", "127.0.0.1:0"}, []string{"LOG_FORMAT=json"}, 1,
			[]string{"address already in use"}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			code := serve(context.Background(), tc.args, tc.environ, false, &stderr)
			if code != tc.code {
				t.Errorf("exit %d, want %d", code, tc.code)
			}
			var errs []string
			for _, line := range strings.Split(strings.TrimSuffix(stderr.String(), "\n"), "\n") {
				var rec map[string]any
				if err := json.Unmarshal([]byte(line), &rec); err != nil {
					t.Fatalf("a line of stderr is not JSON (%v): %q\nstderr:\n%s", err, line, stderr.String())
				}
				// Upstream's environment gets upstream's field names
				// (logrus's, as upstream's logger writes JSON).
				if tc.upstream {
					if rec["@message"] == nil || rec["@timestamp"] == nil || rec["msg"] != nil {
						t.Errorf("upstream's environment, and a record without upstream's field names: %s", line)
					}
					if rec["level"] == "error" {
						errs = append(errs, line)
					}
				} else if rec["level"] == "ERROR" {
					errs = append(errs, line)
				}
			}
			if len(errs) != 1 {
				t.Fatalf("%d ERROR records, want 1:\n%s", len(errs), stderr.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(errs[0], w) {
					t.Errorf("the ERROR record does not say %q: %s", w, errs[0])
				}
			}
		})
	}

	// The config errors are a list, each file:line:col first.
	var stderr bytes.Buffer
	serve(context.Background(), append([]string{"--config-dir", bad, "--log-format", "json"}, loopback...), nil, false, &stderr)
	var rec struct {
		Errors []string `json:"errors"`
	}
	lines := strings.Split(strings.TrimSpace(stderr.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &rec); err != nil || len(rec.Errors) != 4 {
		t.Fatalf("want the 4 config errors as a list (%v):\n%s", err, stderr.String())
	}
	for _, e := range rec.Errors {
		if !strings.HasPrefix(e, filepath.Join(bad, "bad.yaml")+":") || strings.Count(strings.SplitN(e, ": ", 2)[0], ":") != 2 {
			t.Errorf("not file:line:col first: %q", e)
		}
	}

	// In text, too, one line.
	stderr.Reset()
	if code := serve(context.Background(), []string{"--replicas", "0", "--config-dir", "/no/such/dir"}, nil, false, &stderr); code != 2 {
		t.Fatalf("exit %d", code)
	}
	if out := strings.TrimSuffix(stderr.String(), "\n"); strings.Contains(out, "\n") || !strings.HasPrefix(out, "time=") || !strings.Contains(out, "level=ERROR") {
		t.Fatalf("want one text record:\n%s", stderr.String())
	}
}
