package config

import (
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func env(m map[string]string) func(string) string { return func(k string) string { return m[k] } }

func TestFlagsWinOverEnv(t *testing.T) {
	dir := t.TempDir()
	c, err := Parse("serve", []string{"--replicas", "3", "--config-dir", dir}, env(map[string]string{
		"SHARELIMIT_REPLICAS": "7", "SHARELIMIT_MAX_BUCKETS": "42", "SHARELIMIT_DRAIN": "2", "SHARELIMIT_CONSUL_STALE": "false",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.Replicas != 3 || c.MaxBuckets != 42 || c.Drain != 2*time.Second || c.ConsulStale {
		t.Fatalf("got %+v", c)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
}

func TestDefaults(t *testing.T) {
	c := Defaults()
	if c.GRPCAddr != "127.0.0.1:8081" || c.HTTPAddr != "127.0.0.1:8080" || c.Replicas != 1 || c.MaxBuckets != 1_000_000 || !c.ConsulStale {
		t.Fatalf("defaults %+v", c)
	}
}

func TestEveryFlagHasAnEnvName(t *testing.T) {
	c := Defaults()
	n := 0
	c.FlagSet("x").VisitAll(func(f *flag.Flag) {
		n++
		if got := EnvName(f.Name); !strings.HasPrefix(got, "SHARELIMIT_") || strings.Contains(got, "-") {
			t.Errorf("%s -> %s", f.Name, got)
		}
	})
	if n < 20 {
		t.Fatalf("only %d flags", n)
	}
}

func TestBadEnvNamesTheVariable(t *testing.T) {
	_, err := Parse("serve", nil, env(map[string]string{"SHARELIMIT_REPLICAS": "many"}), io.Discard)
	if err == nil || !strings.Contains(err.Error(), "SHARELIMIT_REPLICAS") {
		t.Fatalf("got %v", err)
	}
}

func TestValidate(t *testing.T) {
	dir := t.TempDir()
	cases := []struct {
		name string
		args []string
		want string
	}{
		{"non-loopback needs --allow-remote", []string{"--grpc-addr", "0.0.0.0:8081"}, "--grpc-addr: 0.0.0.0 is not a loopback"},
		{"bad address", []string{"--http-addr", "nonsense"}, "--http-addr: want host:port"},
		{"empty unix path", []string{"--grpc-addr", "unix:"}, "unix: needs a socket path"},
		{"replicas", []string{"--replicas", "0"}, "--replicas: must be at least 1"},
		{"consul flags without service", []string{"--node", "n1"}, "--node: has no effect without --consul-service or --domain-service"},
		{"tls pair", []string{"--grpc-tls-cert", "/nope"}, "--grpc-tls-cert and --grpc-tls-key go together"},
		{"header name", []string{"--header-limit", "bad header"}, "not a valid header name"},
		{"log format", []string{"--log-format", "xml"}, "--log-format"},
		{"missing dir", []string{"--config-dir", dir + "/missing"}, "--config-dir"},
		{"consul wait bound", []string{"--consul-wait", "1h"}, "--consul-wait"},
		{"config type", []string{"--config-type", "ads"}, "--config-type: want FILE or GRPC_XDS_SOTW"},
		{"xds flag without xds", []string{"--xds-server-url", "xds:1"}, "--xds-server-url: has no effect without --config-type GRPC_XDS_SOTW"},
		{"xds backoff without xds", []string{"--xds-backoff-max", "2m"}, "--xds-backoff-max: has no effect without --config-type GRPC_XDS_SOTW"},
		{"xds tls without xds", []string{"--xds-tls"}, "--xds-tls: has no effect without --config-type GRPC_XDS_SOTW"},
		{"xds url empty", []string{"--config-type", "GRPC_XDS_SOTW", "--xds-server-url", ""}, "--xds-server-url: must not be empty"},
		{"xds node id empty", []string{"--config-type", "GRPC_XDS_SOTW", "--xds-node-id", ""}, "--xds-node-id: must not be empty"},
		{"xds metadata", []string{"--config-type", "GRPC_XDS_SOTW", "--xds-node-metadata", "zone"}, "--xds-node-metadata: entry 1 has no"},
		{"xds headers", []string{"--config-type", "GRPC_XDS_SOTW", "--xds-headers", "x-a:1,b"}, "--xds-headers: entry 2 has no"},
		{"xds header name", []string{"--config-type", "GRPC_XDS_SOTW", "--xds-headers", "bad header:1"}, "--xds-headers: \"bad header\" is not a valid gRPC metadata key"},
		{"xds header names differ only in case", []string{"--config-type", "GRPC_XDS_SOTW", "--xds-headers", "X-A:1,x-a:2"}, "--xds-headers: \"x-a\" is given twice"},
		{"xds tls files need --xds-tls", []string{"--config-type", "GRPC_XDS_SOTW", "--xds-tls-ca", "/ca.pem"}, "--xds-tls-ca: has no effect without --xds-tls"},
		{"xds tls pair", []string{"--config-type", "GRPC_XDS_SOTW", "--xds-tls", "--xds-tls-key", "/k"}, "--xds-tls-cert and --xds-tls-key go together"},
		{"xds tls files exist", []string{"--config-type", "GRPC_XDS_SOTW", "--xds-tls", "--xds-tls-ca", dir + "/missing.pem"}, "--xds-tls-ca:"},
		{"xds backoff initial", []string{"--config-type", "GRPC_XDS_SOTW", "--xds-backoff-initial", "0"}, "--xds-backoff-initial: must be positive"},
		{"xds backoff max", []string{"--config-type", "GRPC_XDS_SOTW", "--xds-backoff-initial", "1m", "--xds-backoff-max", "10s"}, "--xds-backoff-max: must be at least --xds-backoff-initial"},
		{"xds jitter", []string{"--config-type", "GRPC_XDS_SOTW", "--xds-backoff-jitter", "1.5"}, "--xds-backoff-jitter: must be between 0 and 1"},
		{"xds message size", []string{"--config-type", "GRPC_XDS_SOTW", "--xds-max-msg-size", "-1"}, "--xds-max-msg-size: must not be negative"},
		{"debug addr loopback", []string{"--debug-addr", "0.0.0.0:6070"}, "--debug-addr: 0.0.0.0 is not a loopback"},
		{"debug addr form", []string{"--debug-addr", "6070"}, "--debug-addr: want host:port"},
		{"debug addr unix", []string{"--debug-addr", "unix:/x"}, "--debug-addr: want host:port"},
		{"debug addr clash", []string{"--debug-addr", "127.0.0.1:8080"}, "--debug-addr: 127.0.0.1:8080 and --http-addr 127.0.0.1:8080 both listen on port 8080"},
		{"client san needs ca", []string{"--grpc-tls-client-san", "envoy"}, "--grpc-tls-client-san: needs --grpc-tls-client-ca"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"--config-dir", dir}, tc.args...)
			c, err := Parse("serve", args, env(nil), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
	c, _ := Parse("serve", []string{"--config-dir", dir, "--grpc-addr", "0.0.0.0:8081", "--allow-remote", "--grpc-addr", "unix:/tmp/x.sock"}, env(nil), io.Discard)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	// With xDS the rules do not come from a directory: a missing one is fine,
	// and so are the xDS settings.
	c, _ = Parse("serve", []string{"--config-dir", dir + "/missing", "--config-type", "grpc_xds_sotw", "--xds-server-url", "xds:18000",
		"--xds-node-metadata", "zone:a,tier=edge", "--xds-headers", "x-tenant:blue", "--xds-tls", "--xds-tls-san", "xds.example",
		"--debug-addr", "127.0.0.1:6070", "--grpc-addr", "127.0.0.1:0", "--http-addr", "127.0.0.1:0"}, env(nil), io.Discard)
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.ConfigType != ConfigXDS {
		t.Fatalf("config type %q", c.ConfigType)
	}
}

func TestApplyEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		check   func(c *Config) bool
		wantErr []string // each must appear in the error; nil: no error
	}{
		{
			name:  "flag wins over env",
			args:  []string{"--replicas", "3", "--grpc-addr", "127.0.0.1:9"},
			env:   map[string]string{"SHARELIMIT_REPLICAS": "7", "SHARELIMIT_GRPC_ADDR": "127.0.0.1:7"},
			check: func(c *Config) bool { return c.Replicas == 3 && c.GRPCAddr == "127.0.0.1:9" },
		},
		{
			name: "env sets an unset flag",
			env:  map[string]string{"SHARELIMIT_MAX_BUCKETS": "42", "SHARELIMIT_DRAIN": "2", "SHARELIMIT_CONSUL_STALE": "false"},
			check: func(c *Config) bool {
				return c.MaxBuckets == 42 && c.Drain == 2*time.Second && !c.ConsulStale
			},
		},
		{
			// An empty string is a valid value for string flags and not for the
			// others; either way an empty variable must count as unset.
			name: "empty env value leaves the default",
			env:  map[string]string{"SHARELIMIT_GRPC_ADDR": "", "SHARELIMIT_REPLICAS": "", "SHARELIMIT_CONSUL_STALE": "", "SHARELIMIT_DRAIN": ""},
			check: func(c *Config) bool {
				d := Defaults()
				return c.GRPCAddr == d.GRPCAddr && c.Replicas == d.Replicas && c.ConsulStale == d.ConsulStale && c.Drain == d.Drain
			},
		},
		{
			name:    "bad env value names the variable",
			env:     map[string]string{"SHARELIMIT_REPLICAS": "many"},
			wantErr: []string{"SHARELIMIT_REPLICAS"},
		},
		{
			name:    "every bad env value is reported",
			env:     map[string]string{"SHARELIMIT_REPLICAS": "many", "SHARELIMIT_DRAIN": "soon"},
			wantErr: []string{"SHARELIMIT_REPLICAS", "SHARELIMIT_DRAIN"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := Defaults()
			fs := c.FlagSet("serve")
			fs.SetOutput(io.Discard)
			if err := fs.Parse(tc.args); err != nil {
				t.Fatal(err)
			}
			err := ApplyEnv(fs, env(tc.env))
			if tc.wantErr == nil {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				if !tc.check(c) {
					t.Fatalf("got %+v", c)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one naming %q", tc.wantErr)
			}
			for _, want := range tc.wantErr {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %s", err, want)
				}
			}
		})
	}
}
