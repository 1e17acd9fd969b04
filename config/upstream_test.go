package config

import (
	"bufio"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/upstream")

// readEnv reads a testdata .env file: NAME=value lines, # comments.
func readEnv(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var environ []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		environ = append(environ, line)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return environ
}

func environOf(m map[string]string) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		out = append(out, k+"="+m[k])
	}
	return out
}

// renderNotices is the golden form of a Config's notices.
func renderNotices(ns []Notice) string {
	var b strings.Builder
	for _, n := range ns {
		fmt.Fprintf(&b, "%s %s\n    vars: %s\n", n.Level, n.Message, strings.Join(n.Vars, " "))
	}
	return b.String()
}

func TestUpstreamPrecedence(t *testing.T) {
	t.Parallel()
	type tc struct {
		vars map[string]string // the upstream variables under test
		base map[string]string // what they need to apply at all (a gate); set in every step
		flag string            // the setting they feed
		sh   string            // SHARELIMIT_<flag>'s value
		fl   string            // --flag's value
		get  func(*Config) any
		// The setting's value: with nothing set, from upstream's variables,
		// with SHARELIMIT_* also set, and with the flag also given.
		def, up, fromSh, fromFl any
	}
	addr := func(c *Config) any { return c.GRPCAddr }
	httpAddr := func(c *Config) any { return c.HTTPAddr }
	debugAddr := func(c *Config) any { return c.DebugAddr }
	dir := func(c *Config) any { return c.ConfigDir }
	tls := map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/up/cert", "GRPC_SERVER_TLS_KEY": "/up/key"}
	with := func(m map[string]string, kv ...string) map[string]string {
		out := map[string]string{}
		maps.Copy(out, m)
		for i := 0; i < len(kv); i += 2 {
			out[kv[i]] = kv[i+1]
		}
		return out
	}
	xds := map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW"}
	xdsTLS := with(xds, "CONFIG_GRPC_XDS_SERVER_USE_TLS", "true")
	prom := map[string]string{"USE_PROMETHEUS": "true"}
	boolCase := func(name, flag string, get func(*Config) any) tc {
		return tc{vars: map[string]string{name: "true"}, flag: flag, sh: "false", fl: "true", get: get, def: false, up: true, fromSh: false, fromFl: true}
	}
	cases := map[string]tc{
		"GRPC_HOST":  {vars: map[string]string{"GRPC_HOST": "localhost"}, flag: "grpc-addr", sh: "127.0.0.2:1", fl: "127.0.0.3:2", get: addr, def: "127.0.0.1:8081", up: "localhost:8081", fromSh: "127.0.0.2:1", fromFl: "127.0.0.3:2"},
		"GRPC_PORT":  {vars: map[string]string{"GRPC_PORT": "9081"}, flag: "grpc-addr", sh: "127.0.0.2:1", fl: "127.0.0.3:2", get: addr, def: "127.0.0.1:8081", up: "0.0.0.0:9081", fromSh: "127.0.0.2:1", fromFl: "127.0.0.3:2"},
		"GRPC_UDS":   {vars: map[string]string{"GRPC_UDS": "/run/rl.sock", "GRPC_PORT": "9081"}, flag: "grpc-addr", sh: "127.0.0.2:1", fl: "unix:/x", get: addr, def: "127.0.0.1:8081", up: "unix:/run/rl.sock", fromSh: "127.0.0.2:1", fromFl: "unix:/x"},
		"HOST":       {vars: map[string]string{"HOST": "::1"}, flag: "http-addr", sh: "127.0.0.2:1", fl: "127.0.0.3:2", get: httpAddr, def: "127.0.0.1:8080", up: "[::1]:8080", fromSh: "127.0.0.2:1", fromFl: "127.0.0.3:2"},
		"PORT":       {vars: map[string]string{"PORT": "9080"}, flag: "http-addr", sh: "127.0.0.2:1", fl: "127.0.0.3:2", get: httpAddr, def: "127.0.0.1:8080", up: "127.0.0.1:9080", fromSh: "127.0.0.2:1", fromFl: "127.0.0.3:2"},
		"HOST+PORT":  {vars: map[string]string{"HOST": "localhost", "PORT": "9080"}, flag: "http-addr", sh: "127.0.0.2:1", fl: "127.0.0.3:2", get: httpAddr, def: "127.0.0.1:8080", up: "localhost:9080", fromSh: "127.0.0.2:1", fromFl: "127.0.0.3:2"},
		"DEBUG_HOST": {vars: map[string]string{"DEBUG_HOST": "localhost"}, flag: "debug-addr", sh: "127.0.0.2:1", fl: "127.0.0.3:2", get: debugAddr, def: "", up: "localhost:6070", fromSh: "127.0.0.2:1", fromFl: "127.0.0.3:2"},
		"DEBUG_PORT": {vars: map[string]string{"DEBUG_PORT": "6071"}, flag: "debug-addr", sh: "127.0.0.2:1", fl: "127.0.0.3:2", get: debugAddr, def: "", up: "0.0.0.0:6071", fromSh: "127.0.0.2:1", fromFl: "127.0.0.3:2"},

		"RUNTIME_ROOT":         {vars: map[string]string{"RUNTIME_ROOT": "/data"}, flag: "config-dir", sh: "/sh", fl: "/fl", get: dir, def: "/etc/sharelimit/config", up: "/data/config", fromSh: "/sh", fromFl: "/fl"},
		"RUNTIME_SUBDIRECTORY": {vars: map[string]string{"RUNTIME_SUBDIRECTORY": "rl"}, flag: "config-dir", sh: "/sh", fl: "/fl", get: dir, def: "/etc/sharelimit/config", up: "/srv/runtime_data/current/rl/config", fromSh: "/sh", fromFl: "/fl"},
		"RUNTIME_APPDIRECTORY": {vars: map[string]string{"RUNTIME_APPDIRECTORY": "rules"}, flag: "config-dir", sh: "/sh", fl: "/fl", get: dir, def: "/etc/sharelimit/config", up: "/srv/runtime_data/current/rules", fromSh: "/sh", fromFl: "/fl"},
		"RUNTIME_*":            {vars: map[string]string{"RUNTIME_ROOT": "/data", "RUNTIME_SUBDIRECTORY": "ratelimit", "RUNTIME_APPDIRECTORY": "app"}, flag: "config-dir", sh: "/sh", fl: "/fl", get: dir, def: "/etc/sharelimit/config", up: "/data/ratelimit/app", fromSh: "/sh", fromFl: "/fl"},

		"LOG_LEVEL":  {vars: map[string]string{"LOG_LEVEL": "WARNING"}, flag: "log-level", sh: "error", fl: "debug", get: func(c *Config) any { return c.LogLevel }, def: "info", up: "warn", fromSh: "error", fromFl: "debug"},
		"LOG_FORMAT": {vars: map[string]string{"LOG_FORMAT": "JSON"}, flag: "log-format", sh: "text", fl: "json", get: func(c *Config) any { return c.LogFormat }, def: "text", up: "json", fromSh: "text", fromFl: "json"},

		"SHADOW_MODE":                             boolCase("SHADOW_MODE", "shadow-mode", func(c *Config) any { return c.ShadowMode }),
		"QUOTA_MODE":                              boolCase("QUOTA_MODE", "quota-mode", func(c *Config) any { return c.QuotaMode }),
		"RESPONSE_DYNAMIC_METADATA":               boolCase("RESPONSE_DYNAMIC_METADATA", "response-dynamic-metadata", func(c *Config) any { return c.ResponseDynamicMetadata }),
		"MERGE_DOMAIN_CONFIG":                     boolCase("MERGE_DOMAIN_CONFIG", "merge-domain-config", func(c *Config) any { return c.MergeDomainConfig }),
		"FORCE_START_WITHOUT_INITIAL_CONFIG":      boolCase("FORCE_START_WITHOUT_INITIAL_CONFIG", "force-start-without-initial-config", func(c *Config) any { return c.ForceStart }),
		"HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED": boolCase("HEALTHY_WITH_AT_LEAST_ONE_CONFIG_LOADED", "healthy-with-at-least-one-config-loaded", func(c *Config) any { return c.HealthyWithConfig }),
		"LIMIT_RESPONSE_HEADERS_ENABLED":          boolCase("LIMIT_RESPONSE_HEADERS_ENABLED", "response-headers", func(c *Config) any { return c.ResponseHeaders }),
		"LIMIT_LIMIT_HEADER":                      {vars: map[string]string{"LIMIT_LIMIT_HEADER": "X-Up"}, flag: "header-limit", sh: "X-Sh", fl: "X-Fl", get: func(c *Config) any { return c.HeaderLimit }, def: "RateLimit-Limit", up: "X-Up", fromSh: "X-Sh", fromFl: "X-Fl"},
		"LIMIT_REMAINING_HEADER":                  {vars: map[string]string{"LIMIT_REMAINING_HEADER": "X-Up"}, flag: "header-remaining", sh: "X-Sh", fl: "X-Fl", get: func(c *Config) any { return c.HeaderRemaining }, def: "RateLimit-Remaining", up: "X-Up", fromSh: "X-Sh", fromFl: "X-Fl"},
		"LIMIT_RESET_HEADER":                      {vars: map[string]string{"LIMIT_RESET_HEADER": "X-Up"}, flag: "header-reset", sh: "X-Sh", fl: "X-Fl", get: func(c *Config) any { return c.HeaderReset }, def: "RateLimit-Reset", up: "X-Up", fromSh: "X-Sh", fromFl: "X-Fl"},

		"GRPC_SERVER_TLS_CERT":   {vars: tls, flag: "grpc-tls-cert", sh: "/sh", fl: "/fl", get: func(c *Config) any { return c.GRPCTLSCert }, def: "", up: "/up/cert", fromSh: "/sh", fromFl: "/fl"},
		"GRPC_SERVER_TLS_KEY":    {vars: tls, flag: "grpc-tls-key", sh: "/sh", fl: "/fl", get: func(c *Config) any { return c.GRPCTLSKey }, def: "", up: "/up/key", fromSh: "/sh", fromFl: "/fl"},
		"GRPC_CLIENT_TLS_CACERT": {vars: with(tls, "GRPC_CLIENT_TLS_CACERT", "/up/ca"), flag: "grpc-tls-client-ca", sh: "/sh", fl: "/fl", get: func(c *Config) any { return c.GRPCTLSClientCA }, def: "", up: "/up/ca", fromSh: "/sh", fromFl: "/fl"},
		"GRPC_CLIENT_TLS_SAN":    {vars: with(tls, "GRPC_CLIENT_TLS_CACERT", "/up/ca", "GRPC_CLIENT_TLS_SAN", "envoy.up"), flag: "grpc-tls-client-san", sh: "envoy.sh", fl: "envoy.fl", get: func(c *Config) any { return c.GRPCTLSClientSAN }, def: "", up: "envoy.up", fromSh: "envoy.sh", fromFl: "envoy.fl"},

		"CONFIG_TYPE":                               {vars: map[string]string{"CONFIG_TYPE": "grpc_xds_sotw"}, flag: "config-type", sh: "file", fl: "Grpc_Xds_Sotw", get: func(c *Config) any { return c.ConfigType }, def: "FILE", up: "GRPC_XDS_SOTW", fromSh: "FILE", fromFl: "GRPC_XDS_SOTW"},
		"CONFIG_GRPC_XDS_SERVER_URL":                {base: xds, vars: map[string]string{"CONFIG_GRPC_XDS_SERVER_URL": "up:1"}, flag: "xds-server-url", sh: "sh:1", fl: "fl:1", get: func(c *Config) any { return c.XDSServerURL }, def: "localhost:18000", up: "up:1", fromSh: "sh:1", fromFl: "fl:1"},
		"CONFIG_GRPC_XDS_NODE_ID":                   {base: xds, vars: map[string]string{"CONFIG_GRPC_XDS_NODE_ID": "up"}, flag: "xds-node-id", sh: "sh", fl: "fl", get: func(c *Config) any { return c.XDSNodeID }, def: "default", up: "up", fromSh: "sh", fromFl: "fl"},
		"CONFIG_GRPC_XDS_NODE_METADATA":             {base: xds, vars: map[string]string{"CONFIG_GRPC_XDS_NODE_METADATA": "a:1,b=2"}, flag: "xds-node-metadata", sh: "s=1", fl: "f=1", get: func(c *Config) any { return c.XDSNodeMetadata }, def: "", up: "a:1,b=2", fromSh: "s=1", fromFl: "f=1"},
		"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": {base: xds, vars: map[string]string{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "x-a:1"}, flag: "xds-headers", sh: "x-s:1", fl: "x-f:1", get: func(c *Config) any { return c.XDSHeaders }, def: "", up: "x-a:1", fromSh: "x-s:1", fromFl: "x-f:1"},
		"CONFIG_GRPC_XDS_SERVER_USE_TLS":            {base: xds, vars: map[string]string{"CONFIG_GRPC_XDS_SERVER_USE_TLS": "true"}, flag: "xds-tls", sh: "false", fl: "true", get: func(c *Config) any { return c.XDSTLS }, def: false, up: true, fromSh: false, fromFl: true},
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT":           {base: xdsTLS, vars: map[string]string{"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/up"}, flag: "xds-tls-cert", sh: "/sh", fl: "/fl", get: func(c *Config) any { return c.XDSTLSCert }, def: "", up: "/up", fromSh: "/sh", fromFl: "/fl"},
		"CONFIG_GRPC_XDS_CLIENT_TLS_KEY":            {base: xdsTLS, vars: map[string]string{"CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/up"}, flag: "xds-tls-key", sh: "/sh", fl: "/fl", get: func(c *Config) any { return c.XDSTLSKey }, def: "", up: "/up", fromSh: "/sh", fromFl: "/fl"},
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT":         {base: xdsTLS, vars: map[string]string{"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/up"}, flag: "xds-tls-ca", sh: "/sh", fl: "/fl", get: func(c *Config) any { return c.XDSTLSCA }, def: "", up: "/up", fromSh: "/sh", fromFl: "/fl"},
		"CONFIG_GRPC_XDS_SERVER_TLS_SAN":            {base: xdsTLS, vars: map[string]string{"CONFIG_GRPC_XDS_SERVER_TLS_SAN": "up"}, flag: "xds-tls-san", sh: "sh", fl: "fl", get: func(c *Config) any { return c.XDSTLSSAN }, def: "", up: "up", fromSh: "sh", fromFl: "fl"},
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL":       {base: xds, vars: map[string]string{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "5s"}, flag: "xds-backoff-initial", sh: "7s", fl: "9", get: func(c *Config) any { return c.XDSBackoffInitial }, def: 10 * time.Second, up: 5 * time.Second, fromSh: 7 * time.Second, fromFl: 9 * time.Second},
		"XDS_CLIENT_BACKOFF_MAX_INTERVAL":           {base: xds, vars: map[string]string{"XDS_CLIENT_BACKOFF_MAX_INTERVAL": "2m"}, flag: "xds-backoff-max", sh: "3m", fl: "4m", get: func(c *Config) any { return c.XDSBackoffMax }, def: time.Minute, up: 2 * time.Minute, fromSh: 3 * time.Minute, fromFl: 4 * time.Minute},
		"XDS_CLIENT_BACKOFF_RANDOM_FACTOR":          {base: xds, vars: map[string]string{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "0.25"}, flag: "xds-backoff-jitter", sh: "0.75", fl: "1", get: func(c *Config) any { return c.XDSBackoffJitter }, def: 0.5, up: 0.25, fromSh: 0.75, fromFl: 1.0},
		"XDS_CLIENT_BACKOFF_JITTER":                 {base: xds, vars: map[string]string{"XDS_CLIENT_BACKOFF_JITTER": "false", "XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "0.25"}, flag: "xds-backoff-jitter", sh: "0.75", fl: "1", get: func(c *Config) any { return c.XDSBackoffJitter }, def: 0.5, up: 0.0, fromSh: 0.75, fromFl: 1.0},
		"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES":          {base: xds, vars: map[string]string{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "1048576"}, flag: "xds-max-msg-size", sh: "2048", fl: "4096", get: func(c *Config) any { return c.XDSMaxMsgSize }, def: 0, up: 1048576, fromSh: 2048, fromFl: 4096},

		"USE_PROMETHEUS":  {vars: map[string]string{"USE_PROMETHEUS": "true"}, flag: "metrics-addr", sh: "127.0.0.2:1", fl: "127.0.0.3:2", get: func(c *Config) any { return c.MetricsAddr }, def: "", up: ":9090", fromSh: "127.0.0.2:1", fromFl: "127.0.0.3:2"},
		"PROMETHEUS_ADDR": {base: prom, vars: map[string]string{"PROMETHEUS_ADDR": "127.0.0.1:9191"}, flag: "metrics-addr", sh: "127.0.0.2:1", fl: ":2", get: func(c *Config) any { return c.MetricsAddr }, def: ":9090", up: "127.0.0.1:9191", fromSh: "127.0.0.2:1", fromFl: ":2"},
		"PROMETHEUS_PATH": {base: prom, vars: map[string]string{"PROMETHEUS_PATH": "/up"}, flag: "metrics-path", sh: "/sh", fl: "/fl", get: func(c *Config) any { return c.MetricsPath }, def: "/metrics", up: "/up", fromSh: "/sh", fromFl: "/fl"},
		"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": {base: prom, vars: map[string]string{"PROMETHEUS_RESPONSE_TIME_AS_MILLISECONDS": "true"}, flag: "metrics-response-time-ms", sh: "false", fl: "true",
			get: func(c *Config) any { return c.MetricsMilliseconds }, def: false, up: true, fromSh: false, fromFl: true},
		"NEAR_LIMIT_RATIO": {vars: map[string]string{"NEAR_LIMIT_RATIO": "0.5"}, flag: "near-limit-ratio", sh: "0.25", fl: "1", get: func(c *Config) any { return c.NearLimitRatio }, def: 0.8, up: 0.5, fromSh: 0.25, fromFl: 1.0},
	}

	// Every variable the table maps to a setting has a case here.
	covered := map[string]bool{}
	for _, c := range cases {
		for name := range c.vars {
			covered[name] = true
		}
	}
	for _, v := range UpstreamVariables() {
		if v.To != UpstreamIgnored && !covered[v.Name] {
			t.Errorf("%s maps to %s but has no precedence case", v.Name, v.To)
		}
	}

	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			steps := []struct {
				step string
				env  map[string]string
				args []string
				want any
			}{
				{"default", c.base, nil, c.def},
				{"upstream", with(c.base, flatten(c.vars)...), nil, c.up},
				{"SHARELIMIT_ wins over upstream", with(with(c.base, flatten(c.vars)...), EnvName(c.flag), c.sh), nil, c.fromSh},
				{"flag wins over both", with(with(c.base, flatten(c.vars)...), EnvName(c.flag), c.sh), []string{"--" + c.flag + "=" + c.fl}, c.fromFl},
			}
			for _, s := range steps {
				cfg, err := Parse("serve", s.args, env(s.env), io.Discard)
				if err != nil {
					t.Fatalf("%s: %v", s.step, err)
				}
				if got := c.get(cfg); !reflect.DeepEqual(got, s.want) {
					t.Errorf("%s: got %#v, want %#v", s.step, got, s.want)
				}
				// ParseEnviron reads the same variables the same way.
				cfg2, err := ParseEnviron("serve", s.args, environOf(s.env), io.Discard)
				if err != nil {
					t.Fatalf("%s: ParseEnviron: %v", s.step, err)
				}
				if !reflect.DeepEqual(cfg, cfg2) {
					t.Errorf("%s: Parse and ParseEnviron differ:\n%+v\n%+v", s.step, cfg, cfg2)
				}
			}
		})
	}
}

func flatten(m map[string]string) []string {
	var out []string
	for k, v := range m {
		out = append(out, k, v)
	}
	return out
}

// TestConfigAllFilesFollowsRuntime: a directory from RUNTIME_* is read as
// upstream reads it (every file, subdirectories too), unless the setting is
// given; a directory from --config-dir is not.
func TestConfigAllFilesFollowsRuntime(t *testing.T) {
	t.Parallel()
	env := []string{"RUNTIME_ROOT=/data", "RUNTIME_SUBDIRECTORY=rl"}
	for _, tc := range []struct {
		args []string
		env  []string
		want bool
	}{
		{nil, env, true},
		{[]string{"--config-all-files=false"}, env, false},
		{nil, append([]string{"SHARELIMIT_CONFIG_ALL_FILES=false"}, env...), false},
		{[]string{"--config-dir", "/etc/x"}, env, false},
		{nil, nil, false},
	} {
		cfg, err := ParseEnviron("serve", tc.args, tc.env, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.ConfigAllFiles != tc.want {
			t.Errorf("%v %v: ConfigAllFiles = %v, want %v", tc.args, tc.env, cfg.ConfigAllFiles, tc.want)
		}
	}
}

func TestUpstreamTypicalDeployment(t *testing.T) {
	t.Parallel()
	cfg, err := ParseEnviron("serve", nil, readEnv(t, "testdata/upstream/k8s.env"), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := Defaults()
	want.ConfigDir = "/data/ratelimit/config"
	want.ConfigAllFiles = true // upstream's directory, read as upstream reads it
	// Upstream's addresses: its Service and its probes reach the pod's IP.
	want.HTTPAddr = "0.0.0.0:8080"
	want.GRPCAddr = "0.0.0.0:8081"
	want.DebugAddr = "0.0.0.0:6070"
	want.LocalHTTPAddr = "127.0.0.1:8082" // every admin page, on loopback
	want.AllowRemote = true
	want.UpstreamBy = []string{"GRPC_PORT", "DEBUG_PORT", "RUNTIME_ROOT", "RUNTIME_SUBDIRECTORY", "RUNTIME_WATCH_ROOT", "RUNTIME_IGNOREDOTFILES", "REDIS_SOCKET_TYPE", "REDIS_URL", "USE_STATSD"}
	want.LogLevel = "debug"
	got := *cfg
	got.Notices = nil
	if !reflect.DeepEqual(&got, want) {
		t.Errorf("config:\n got %+v\nwant %+v", &got, want)
	}
	var warns []Notice
	for _, n := range cfg.Notices {
		if n.Level >= slog.LevelWarn {
			warns = append(warns, n)
		}
	}
	if len(warns) != 1 {
		t.Fatalf("want exactly one warning, got %d:\n%s", len(warns), renderNotices(warns))
	}
	if want := []string{"REDIS_SOCKET_TYPE", "REDIS_URL", "USE_STATSD"}; !slices.Equal(warns[0].Vars, want) {
		t.Errorf("warning names %v, want %v", warns[0].Vars, want)
	}
	for _, name := range warns[0].Vars {
		if !strings.Contains(warns[0].Message, name) {
			t.Errorf("warning message does not name %s: %s", name, warns[0].Message)
		}
	}
}

// TestUpstreamNotices compares each testdata/upstream/*.env's notices with its
// golden file (go test -run TestUpstreamNotices -update rewrites them).
func TestUpstreamNotices(t *testing.T) {
	t.Parallel()
	files, _ := filepath.Glob("testdata/upstream/*.env")
	if len(files) < 5 {
		t.Fatalf("only %d fixtures", len(files))
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) {
			t.Parallel()
			environ := readEnv(t, file)
			cfg, err := ParseEnviron("serve", nil, environ, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if len(cfg.Notices) == 0 {
				t.Fatal("no notices")
			}
			got := renderNotices(cfg.Notices)
			golden := strings.TrimSuffix(file, ".env") + ".golden"
			if *update {
				if err := os.WriteFile(golden, []byte(got), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatal(err)
			}
			if got != string(want) {
				t.Errorf("notices differ from %s:\n--- got\n%s--- want\n%s", golden, got, want)
			}
			// The order is stable: the same input gives the same notices.
			reversed := slices.Clone(environ)
			slices.Reverse(reversed)
			again, _ := ParseEnviron("serve", nil, reversed, io.Discard)
			if renderNotices(again.Notices) != got {
				t.Errorf("notices depend on the order of the environment")
			}
		})
	}
}

func TestUpstreamRemoteHost(t *testing.T) {
	t.Parallel()
	cfg, err := Parse("serve", nil, env(map[string]string{"HOST": "0.0.0.0", "GRPC_PORT": "9081"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	// GRPC_PORT is upstream's alone: upstream's mode, so gRPC listens where
	// upstream's did too.
	if cfg.HTTPAddr != "0.0.0.0:8080" || !cfg.AllowRemote || cfg.GRPCAddr != "0.0.0.0:9081" || cfg.DebugAddr != "0.0.0.0:6070" {
		t.Fatalf("got http %s grpc %s debug %s allow-remote %v", cfg.HTTPAddr, cfg.GRPCAddr, cfg.DebugAddr, cfg.AllowRemote)
	}
	found := false
	for _, n := range cfg.Notices {
		if strings.Contains(n.Message, "beyond loopback") && strings.Contains(n.Message, "--grpc-addr 0.0.0.0:9081") && strings.Contains(n.Message, "--debug-addr 0.0.0.0:6070") {
			found = true
		}
	}
	if !found {
		t.Errorf("no notice that the listeners are beyond loopback:\n%s", renderNotices(cfg.Notices))
	}
	cfg.ConfigDir = t.TempDir()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("an operator's HOST=0.0.0.0 must validate: %v", err)
	}

	// An explicit --allow-remote=false wins: the setting is refused, not widened.
	cfg, err = Parse("serve", []string{"--allow-remote=false", "--config-dir", t.TempDir()}, env(map[string]string{"HOST": "0.0.0.0"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--http-addr: 0.0.0.0 is not a loopback") {
		t.Fatalf("got %v", err)
	}

	// HOST and PORT alone are any program's: not upstream's mode, so the
	// loopback defaults stay, and there is no debug listener.
	cfg, _ = Parse("serve", nil, env(map[string]string{"PORT": "9080", "LOG_LEVEL": "warn"}), io.Discard)
	if cfg.AllowRemote || cfg.HTTPAddr != "127.0.0.1:9080" || cfg.GRPCAddr != "127.0.0.1:8081" || cfg.DebugAddr != "" || len(cfg.UpstreamBy) > 0 {
		t.Fatalf("got %+v", cfg)
	}
	// A SHARELIMIT_* address wins in upstream's mode, and the others still
	// listen where upstream's did.
	cfg, _ = Parse("serve", nil, env(map[string]string{"REDIS_URL": "redis:6379", "SHARELIMIT_GRPC_ADDR": "127.0.0.1:9081"}), io.Discard)
	if cfg.GRPCAddr != "127.0.0.1:9081" || cfg.HTTPAddr != "0.0.0.0:8080" || cfg.DebugAddr != "0.0.0.0:6070" || !slices.Equal(cfg.UpstreamBy, []string{"REDIS_URL"}) {
		t.Fatalf("got %+v", cfg)
	}
	// Run as upstream's command, with nothing set: upstream's mode.
	cfg, _ = ParseUpstreamCommand("serve", nil, nil, io.Discard)
	if cfg.GRPCAddr != "0.0.0.0:8081" || cfg.HTTPAddr != "0.0.0.0:8080" || cfg.DebugAddr != "0.0.0.0:6070" || !slices.Equal(cfg.UpstreamBy, []string{"/bin/ratelimit"}) {
		t.Fatalf("got %+v", cfg)
	}
}

func TestUpstreamBadValues(t *testing.T) {
	t.Parallel()
	xds := func(kv ...string) map[string]string {
		m := map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW"}
		for i := 0; i < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want []string // each must appear; nil: no error
	}{
		{"port not a number", map[string]string{"PORT": "http"}, nil, []string{"PORT"}},
		{"port too large", map[string]string{"GRPC_PORT": "99999"}, nil, []string{"GRPC_PORT"}},
		{"debug port", map[string]string{"DEBUG_PORT": "-1"}, nil, []string{"DEBUG_PORT"}},
		{"boolean", map[string]string{"SHADOW_MODE": "yes"}, nil, []string{"SHADOW_MODE"}},
		{"accepted boolean", map[string]string{"RUNTIME_WATCH_ROOT": "maybe"}, nil, []string{"RUNTIME_WATCH_ROOT"}},
		{"log level", map[string]string{"LOG_LEVEL": "verbose"}, nil, []string{"LOG_LEVEL"}},
		{"config type", map[string]string{"CONFIG_TYPE": "ADS"}, nil, []string{"CONFIG_TYPE"}},
		{"header name", map[string]string{"LIMIT_RESET_HEADER": "Rate Limit"}, nil, []string{"LIMIT_RESET_HEADER"}},
		{"tls without a certificate", map[string]string{"GRPC_SERVER_USE_TLS": "true"}, nil, []string{"GRPC_SERVER_USE_TLS"}},
		{"tls san without a ca", map[string]string{"GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k", "GRPC_CLIENT_TLS_SAN": "envoy"}, nil, []string{"GRPC_CLIENT_TLS_SAN"}},
		{"backoff duration", xds("XDS_CLIENT_BACKOFF_INITIAL_INTERVAL", "soon"), nil, []string{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL"}},
		{"random factor", xds("XDS_CLIENT_BACKOFF_RANDOM_FACTOR", "2"), nil, []string{"XDS_CLIENT_BACKOFF_RANDOM_FACTOR"}},
		{"jitter", xds("XDS_CLIENT_BACKOFF_JITTER", "sometimes"), nil, []string{"XDS_CLIENT_BACKOFF_JITTER"}},
		{"message size", xds("XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES", "-1"), nil, []string{"XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES"}},
		{"node metadata", xds("CONFIG_GRPC_XDS_NODE_METADATA", "zone"), nil, []string{"CONFIG_GRPC_XDS_NODE_METADATA"}},
		{"headers", xds("CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS", "x-a:1,x-b"), nil, []string{"CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS"}},
		{"xds tls switch", xds("CONFIG_GRPC_XDS_SERVER_USE_TLS", "on"), nil, []string{"CONFIG_GRPC_XDS_SERVER_USE_TLS"}},
		{"every bad value at once", map[string]string{"PORT": "x", "QUOTA_MODE": "x", "LOG_LEVEL": "x"}, nil, []string{"PORT", "QUOTA_MODE", "LOG_LEVEL"}},

		// Ignored variables are never an error, whatever they hold.
		{"ignored", map[string]string{"REDIS_POOL_SIZE": "lots", "USE_STATSD": "perhaps", "GRPC_MAX_CONNECTION_AGE": "forever"}, nil, nil},
		// Upstream ignores the xDS variables in FILE mode, and so does sharelimit.
		{"xds variables in file mode", map[string]string{"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "soon"}, nil, nil},
		{"tls files without tls", map[string]string{"GRPC_SERVER_TLS_CERT": "/c", "GRPC_CLIENT_TLS_SAN": "envoy"}, nil, nil},
		// A variable whose setting a flag already gives is not read.
		{"overridden by a flag", map[string]string{"PORT": "http"}, []string{"--http-addr", "127.0.0.1:1"}, nil},
		{"overridden by SHARELIMIT_", map[string]string{"LOG_LEVEL": "verbose", "SHARELIMIT_LOG_LEVEL": "debug"}, nil, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := Parse("serve", tc.args, env(tc.env), io.Discard)
			if tc.want == nil {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want one naming %v", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w+":") {
					t.Errorf("error %q does not name %s", err, w)
				}
			}
		})
	}
}

// TestUpstreamNoticesCarryNoValues sets every variable in the table, in each
// mode, to a value carrying a marker where its type allows one, and checks no
// notice repeats any of them: values may be secrets (REDIS_AUTH).
func TestUpstreamNoticesCarryNoValues(t *testing.T) {
	t.Parallel()
	const marker = "zq9v"
	// Mapped variables need values that parse.
	valid := map[string]string{
		"HOST": "localhost", "PORT": "9080", "DEBUG_HOST": "localhost", "DEBUG_PORT": "9070",
		"GRPC_UDS": "/run/" + marker, "GRPC_HOST": "localhost", "GRPC_PORT": "9081",
		"GRPC_SERVER_TLS_CERT": "/" + marker + "/c", "GRPC_SERVER_TLS_KEY": "/" + marker + "/k",
		"GRPC_CLIENT_TLS_CACERT": "/" + marker + "/ca", "GRPC_CLIENT_TLS_SAN": marker + ".example",
		"LOG_LEVEL": "debug", "LOG_FORMAT": "json",
		"RUNTIME_ROOT": "/" + marker, "RUNTIME_SUBDIRECTORY": marker, "RUNTIME_APPDIRECTORY": marker,
		"LIMIT_LIMIT_HEADER": "X-" + marker, "LIMIT_REMAINING_HEADER": "X-" + marker + "-R", "LIMIT_RESET_HEADER": "X-" + marker + "-S",
		"CONFIG_GRPC_XDS_NODE_ID": marker, "CONFIG_GRPC_XDS_NODE_METADATA": "k:" + marker,
		"CONFIG_GRPC_XDS_SERVER_URL": marker + ":1", "CONFIG_GRPC_XDS_CLIENT_ADDITIONAL_HEADERS": "authorization:" + marker,
		"CONFIG_GRPC_XDS_CLIENT_TLS_CERT": "/" + marker + "/xc", "CONFIG_GRPC_XDS_CLIENT_TLS_KEY": "/" + marker + "/xk",
		"CONFIG_GRPC_XDS_SERVER_TLS_CACERT": "/" + marker + "/xca", "CONFIG_GRPC_XDS_SERVER_TLS_SAN": marker,
		"XDS_CLIENT_BACKOFF_INITIAL_INTERVAL": "1s", "XDS_CLIENT_BACKOFF_MAX_INTERVAL": "2s",
		"XDS_CLIENT_BACKOFF_RANDOM_FACTOR": "0.1", "XDS_CLIENT_MAX_MSG_SIZE_IN_BYTES": "100",
		"PROMETHEUS_ADDR": "127.0.0.1:9191", "PROMETHEUS_PATH": "/" + marker, "NEAR_LIMIT_RATIO": "0.5",
		// Ignored, but upstream parses them, and so does sharelimit.
		"RUNTIME_WATCH_ROOT": "true", "RUNTIME_IGNOREDOTFILES": "false",
	}
	for _, mode := range []string{"FILE", "GRPC_XDS_SOTW"} {
		for _, tlsOn := range []string{"true", "false"} {
			m := map[string]string{}
			for i, v := range UpstreamVariables() {
				name, value := v.Name, valid[v.Name]
				if strings.HasSuffix(name, "*") {
					name = strings.TrimSuffix(name, "*") + "SOMETHING"
				}
				if value == "" {
					if v.To == UpstreamIgnored {
						value = fmt.Sprintf("%s-%d", marker, i)
					} else {
						value = "true" // the switches
					}
				}
				m[name] = value
			}
			m["CONFIG_TYPE"] = mode
			m["GRPC_SERVER_USE_TLS"], m["CONFIG_GRPC_XDS_SERVER_USE_TLS"] = tlsOn, tlsOn
			cfg, err := ParseEnviron("serve", nil, environOf(m), io.Discard)
			if err != nil {
				t.Fatalf("%s tls=%s: %v", mode, tlsOn, err)
			}
			if len(cfg.Notices) == 0 {
				t.Fatalf("%s tls=%s: no notices", mode, tlsOn)
			}
			for _, n := range cfg.Notices {
				if strings.Contains(strings.ToLower(n.Message), marker) || slices.ContainsFunc(n.Vars, func(s string) bool { return strings.Contains(s, marker) }) {
					t.Errorf("%s tls=%s: notice carries a value: %s %v", mode, tlsOn, n.Message, n.Vars)
				}
			}
		}
	}
}

// TestUpstreamTableIsComplete checks the documentation table against every
// name upstream's settings.go reads and against the flags that exist.
func TestUpstreamTableIsComplete(t *testing.T) {
	t.Parallel()
	table := UpstreamVariables()
	names := map[string]UpstreamVar{}
	for _, v := range table {
		if _, dup := names[v.Name]; dup {
			t.Errorf("%s is in the table twice", v.Name)
		}
		names[v.Name] = v
		if v.Why == "" || v.To == "" {
			t.Errorf("%s: To and Why must be filled: %+v", v.Name, v)
		}
	}
	for _, line := range strings.Split(string(must(os.ReadFile("testdata/upstream/settings_names.txt"))), "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if _, ok := names[line]; !ok {
			t.Errorf("upstream's %s is not in UpstreamVariables", line)
		}
	}
	flags := map[string]bool{}
	Defaults().FlagSet("x").VisitAll(func(f *flag.Flag) { flags[f.Name] = true })
	for _, v := range table {
		if v.To == UpstreamIgnored {
			continue
		}
		for _, f := range strings.Split(v.To, ", ") {
			if !strings.HasPrefix(f, "--") || !flags[strings.TrimPrefix(f, "--")] {
				t.Errorf("%s maps to %q, which is not a flag", v.Name, f)
			}
		}
	}
	// The caller's copy is its own.
	table[0].Name = "CHANGED"
	if UpstreamVariables()[0].Name == "CHANGED" {
		t.Error("UpstreamVariables returns the table itself")
	}
}

// TestParseReadsOnlyTheTable: every variable Parse looks up is a SHARELIMIT_*
// one or in the table, so the documentation cannot miss one the code reads.
func TestParseReadsOnlyTheTable(t *testing.T) {
	t.Parallel()
	inTable := map[string]bool{}
	for _, v := range UpstreamVariables() {
		inTable[v.Name] = true
	}
	read := map[string]bool{}
	getenv := func(k string) string {
		read[k] = true
		return map[string]string{"CONFIG_TYPE": "GRPC_XDS_SOTW", "GRPC_SERVER_USE_TLS": "true", "GRPC_SERVER_TLS_CERT": "/c", "GRPC_SERVER_TLS_KEY": "/k", "CONFIG_GRPC_XDS_SERVER_USE_TLS": "true"}[k]
	}
	if _, err := Parse("serve", nil, getenv, io.Discard); err != nil {
		t.Fatal(err)
	}
	for k := range read {
		// <PREFIX>_SERVICE_HOST is read to tell a Kubernetes service link
		// (servicelinks.go) from a variable someone set.
		if !strings.HasPrefix(k, EnvPrefix) && !inTable[k] && !strings.HasSuffix(k, "_SERVICE_HOST") {
			t.Errorf("Parse reads %s, which UpstreamVariables does not list", k)
		}
	}
	for k := range inTable {
		if !strings.HasSuffix(k, "*") && !read[k] {
			t.Errorf("UpstreamVariables lists %s, which Parse never reads", k)
		}
	}
}

func TestParseEnvironFamilies(t *testing.T) {
	t.Parallel()
	environ := []string{"OTEL_SERVICE_NAME=rl", "REDIS_SERVICE_HOST=10.0.0.1", "DOG_STATSD_MOGRIFIER_X_NAME=x", "PATH=/bin", "=C:=C:\\", "NOEQUALS",
		"LOG_LEVEL=debug", "LOG_LEVEL=nonsense"} // the first of a repeated name counts, as os.Getenv
	cfg, err := ParseEnviron("serve", nil, environ, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.LogLevel != "debug" {
		t.Errorf("log level %q", cfg.LogLevel)
	}
	var ignored []string
	for _, n := range cfg.Notices {
		if n.Level == slog.LevelWarn {
			ignored = append(ignored, n.Vars...)
		}
	}
	slices.Sort(ignored)
	// REDIS_SERVICE_HOST is a Kubernetes service link, not upstream's.
	if want := []string{"DOG_STATSD_MOGRIFIER_X_NAME", "OTEL_SERVICE_NAME"}; !slices.Equal(ignored, want) {
		t.Errorf("ignored %v, want %v", ignored, want)
	}
	// Parse, with only getenv, cannot list a family; it still reads every exact name.
	cfg, err = Parse("serve", nil, env(map[string]string{"OTEL_SERVICE_NAME": "rl", "REDIS_URL": "redis:6379"}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if got := renderNotices(cfg.Notices); !strings.Contains(got, "REDIS_URL") || strings.Contains(got, "OTEL_SERVICE_NAME") {
		t.Errorf("notices:\n%s", got)
	}
}

func TestNoUpstreamNoNotices(t *testing.T) {
	t.Parallel()
	cfg, err := ParseEnviron("serve", []string{"--replicas", "2"}, []string{"SHARELIMIT_MAX_BUCKETS=5", "PATH=/bin", "HOME=/root"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Notices) != 0 {
		t.Fatalf("notices without upstream variables:\n%s", renderNotices(cfg.Notices))
	}
}

func TestParseKeyValues(t *testing.T) {
	t.Parallel()
	cases := []struct {
		in      string
		want    map[string]string
		wantErr string
	}{
		{"", map[string]string{}, ""},
		{"k1:v1,k2=v2", map[string]string{"k1": "v1", "k2": "v2"}, ""},
		{" zone : eu-west-1a , tier = edge ,", map[string]string{"zone": "eu-west-1a", "tier": "edge"}, ""},
		{"url=http://x:1/y,t:a=b", map[string]string{"url": "http://x:1/y", "t": "a=b"}, ""},
		{"empty=", map[string]string{"empty": ""}, ""},
		{",,", map[string]string{}, ""},
		{"k1:v1,secretvalue", nil, "entry 2 has no"},
		{":v", nil, "entry 1 has an empty key"},
		{"a:1,a=2", nil, `key "a" is given twice`},
	}
	for _, tc := range cases {
		got, err := ParseKeyValues(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%q: got %v, want an error containing %q", tc.in, err, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "secretvalue") {
				t.Errorf("%q: the error repeats the entry: %v", tc.in, err)
			}
			continue
		}
		if err != nil || !maps.Equal(got, tc.want) {
			t.Errorf("%q: got %v, %v; want %v", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseKeyValues(f *testing.F) {
	for _, s := range []string{"", "k1:v1,k2=v2", "a=b:c", " a : b ", "a,b", ":", "a:1,a:2", ",,,", "x-tenant:blue,authorization:Bearer t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseKeyValues(s)
		if err != nil {
			if m != nil {
				t.Fatalf("%q: a map with an error", s)
			}
			return
		}
		// Written back in one form, the map reads the same.
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(m)) {
			if k == "" || strings.ContainsAny(k, ",:=") || k != strings.TrimSpace(k) {
				t.Fatalf("%q: bad key %q", s, k)
			}
			if strings.Contains(m[k], ",") || m[k] != strings.TrimSpace(m[k]) {
				t.Fatalf("%q: bad value %q", s, m[k])
			}
			parts = append(parts, k+"="+m[k])
		}
		again, err := ParseKeyValues(strings.Join(parts, ","))
		if err != nil || !maps.Equal(m, again) {
			t.Fatalf("%q: %v reads back as %v, %v", s, m, again, err)
		}
	})
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// TestUpstreamDefaultDir: with no directory named anywhere, a container that
// mounted its files at upstream's default finds them there, with a notice;
// sharelimit's own default wins when it exists, and a named one always.
func TestUpstreamDefaultDir(t *testing.T) {
	t.Parallel()
	up := "/srv/runtime_data/current/config"
	exists := func(dirs ...string) func(string) bool {
		return func(p string) bool { return slices.Contains(dirs, p) }
	}
	for _, tc := range []struct {
		name  string
		given bool
		dirs  []string
		want  string
	}{
		{"only upstream's exists", false, []string{up}, up},
		{"ours exists too", false, []string{up, Defaults().ConfigDir}, Defaults().ConfigDir},
		{"neither exists", false, nil, Defaults().ConfigDir},
		{"named by a flag", true, []string{up}, Defaults().ConfigDir},
	} {
		c := Defaults()
		n, ok := upstreamDefaultDir(c, tc.given, exists(tc.dirs...))
		if c.ConfigDir != tc.want || ok != (tc.want == up) || ok && (c.ConfigAllFiles != true || !strings.Contains(n.Message, up)) {
			t.Errorf("%s: dir %s all=%v notice %v %q, want %s", tc.name, c.ConfigDir, c.ConfigAllFiles, ok, n.Message, tc.want)
		}
	}
}
