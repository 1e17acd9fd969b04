package examples_test

import (
	"path/filepath"
	"strings"
	"testing"
)

// breakage is one realistic mistake in a deployment file, and what the guard
// for that file must say about it. Each case proves a guard can fail: it runs
// the same check as the real test, on a copy of the real file with the mistake
// made.
type breakage struct {
	name     string
	old, new string // the edit: the first occurrence of old (all, with all set)
	all      bool
	want     string // a problem must contain this
}

// breakFile applies one mistake, failing when the file no longer contains the
// text to break (the case went stale and would test nothing).
func breakFile(t *testing.T, data []byte, b breakage) []byte {
	t.Helper()
	if !strings.Contains(string(data), b.old) {
		t.Fatalf("the file no longer contains %q: update this case", b.old)
	}
	n := 1
	if b.all {
		n = -1
	}
	return []byte(strings.Replace(string(data), b.old, b.new, n))
}

// expectProblem checks the guard found the mistake.
func expectProblem(t *testing.T, p problems, want string) {
	t.Helper()
	for _, s := range p {
		if strings.Contains(s, want) {
			return
		}
	}
	t.Errorf("the guard missed it: no problem mentions %q; it found:\n%s", want, strings.Join(p, "\n"))
}

// runBreakages runs each case against one file and one check.
func runBreakages(t *testing.T, file string, check func(*problems, []byte), cases []breakage) {
	t.Helper()
	data := readFile(t, file)
	for _, b := range cases {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			var p problems
			check(&p, breakFile(t, data, b))
			expectProblem(t, p, b.want)
		})
	}
}

func TestComposeGuardCatches(t *testing.T) {
	t.Parallel()
	runBreakages(t, "docker-compose.yml", checkCompose, []breakage{
		{name: "misspelt flag", old: "- --consul-service", new: "- --consul-servce", want: "flag provided but not defined: -consul-servce"},
		{name: "variable of no flag", old: "SHARELIMIT_DRAIN: 2s", new: "SHARELIMIT_DRAINING: 2s", want: "SHARELIMIT_DRAINING is not the variable of any serve flag"},
		{name: "variable with a bad value", old: "SHARELIMIT_SHUTDOWN_TIMEOUT: 5s", new: "SHARELIMIT_SHUTDOWN_TIMEOUT: soon", want: "SHARELIMIT_SHUTDOWN_TIMEOUT"},
		{name: "unknown variable", old: "CONSUL_HTTP_ADDR: 127.0.0.1:8500", new: "CONSUL_ADDR: 127.0.0.1:8500", want: "CONSUL_ADDR means nothing"},
		{name: "config mounted elsewhere", old: "./examples/config:/etc/sharelimit/config:ro", new: "./examples/config:/etc/sharelimit/rules:ro", all: true, want: "nothing is mounted there"},
		{name: "config mounted read-write", old: "./examples/config:/etc/sharelimit/config:ro", new: "./examples/config:/etc/sharelimit/config", all: true, want: "read-only"},
		{name: "config that fails check", old: "./examples/config:", new: "./examples/testdata/invalid-descriptors:", all: true, want: "invalid rate limit unit 'fortnight'"},
		{name: "config dir that does not exist", old: "./examples/config:", new: "./examples/konfig:", all: true, want: "--config-dir"},
		{name: "no state file", old: "    - --state-file\n    - /var/lib/sharelimit/state\n", new: "", want: "no --state-file"},
		{name: "state in the container's own layer", old: "      - sharelimit2-state:/var/lib/sharelimit\n", new: "", want: "not a directory the deployment keeps"},
		{name: "grace shorter than the drain", old: "stop_grace_period: 10s", new: "stop_grace_period: 5s", want: "stop_grace_period"},
		{name: "sidecar outside Envoy's namespace", old: "network_mode: service:envoy2\n    volumes:", new: "network_mode: host\n    volumes:", want: "network_mode"},
		{name: "Consul address off the local agent", old: "CONSUL_HTTP_ADDR: 127.0.0.1:8500", new: "CONSUL_HTTP_ADDR: consul:8500", want: "CONSUL_HTTP_ADDR"},
		{name: "registered service is not the counted one", old: "    - --consul-service\n    - app\n", new: "    - --consul-service\n    - web\n", want: `registers "app"`},
		{name: "published port with no listener", old: `"10001:10000"`, new: `"10001:10080"`, want: "no listener"},
		{name: "two agents with one node name", old: "-node=node2", new: "-node=node1", want: "each app node needs its own"},
		{name: "initial replicas off the node count", old: `- "3"`, new: `- "2"`, want: "--replicas 2"},
		{name: "agent joins nothing", old: "-retry-join=consul,", new: "-retry-join=consol,", want: "not a Consul server"},
		{name: "unpinned image", old: "nginx:1.27-alpine", new: "nginx:latest", want: "pin a tag"},
		{name: "bootstrap not mounted", old: "./examples/envoy/envoy.yaml:/etc/envoy/envoy.yaml:ro", new: "./examples/envoy/envoy.yaml:/etc/envoy/other.yaml:ro", want: "not mounted"},
	})
}

func TestEnvoyGuardCatches(t *testing.T) {
	t.Parallel()
	check := func(p *problems, data []byte) {
		checkEnvoy(p, "envoy.yaml", data, envoyWant{grpcAddr: "127.0.0.1:8081", configDir: filepath.Join(repo, "examples", "config"), replicas: 3})
	}
	runBreakages(t, "examples/envoy/envoy.yaml", check, []breakage{
		{name: "sidecar on another port", old: "port_value: 8081", new: "port_value: 8082", want: "but sharelimit listens on --grpc-addr 127.0.0.1:8081"},
		{name: "descriptor no rule matches", old: "descriptor_value: api", new: "descriptor_value: apx", want: "matches no rule"},
		{name: "nested descriptor no rule matches", old: "descriptor_value: login", new: "descriptor_value: signin", want: "header_match=signin"},
		{name: "domain no file defines", old: "domain: edge", new: "domain: edges", want: "matches no rule"},
		{name: "HTTP/1 to a gRPC service", old: "http2_protocol_options: {}", new: "http_protocol_options: {}", want: "HTTP/2"},
		{name: "misspelt field", old: "failure_mode_deny: false", new: "failure_mode_deni: false", want: "not a valid Envoy v3 bootstrap"},
		{name: "misspelt typed config", old: "v3.RateLimit\n", new: "v3.RateLimits\n", want: "not a valid Envoy v3 bootstrap"},
		{name: "value the API forbids", old: "connect_timeout: 0.25s", new: "connect_timeout: -1s", want: "ConnectTimeout"},
		{name: "transport other than v3", old: "transport_api_version: V3", new: "transport_api_version: AUTO", want: "transport_api_version"},
		{name: "admin off loopback", old: "address: 127.0.0.1, port_value: 9901", new: "address: 0.0.0.0, port_value: 9901", want: "admin"},
		{name: "action the guard cannot model", old: "- remote_address: {}", new: "- source_cluster: {}", want: "does not know"},
		{name: "route to a missing cluster", old: "cluster: app\n", new: "cluster: ap\n", want: "does not exist"},
		{name: "rate-limit service cluster missing", old: "cluster_name: sharelimit }", new: "cluster_name: ratelimit }", want: `cluster "ratelimit" does not exist`},
	})
}

func TestEnvoyRLQSGuardCatches(t *testing.T) {
	t.Parallel()
	const file = "examples/envoy/envoy-rlqs.yaml"
	check := func(p *problems, data []byte) {
		checkEnvoyRLQS(p, "envoy-rlqs.yaml", data, envoyWant{grpcAddr: "127.0.0.1:8081", configDir: filepath.Join(repo, "examples", "config"), replicas: 3})
	}
	data := string(readFile(t, file))
	// The first filter's catch-all, comment and all.
	from, to := strings.Index(data, "                        # Catch-all, for a peer"), strings.Index(data, "                  # The whole API's budget")
	if from < 0 || to < from {
		t.Fatalf("%s: the first filter's catch-all is not where this test looks: update it", file)
	}
	const (
		noAssignment = "no_assignment_behavior:\n                                      fallback_rate_limit: { blanket_rule: DENY_ALL }"
		expiry       = "expired_assignment_behavior_timeout: 10s\n                                      fallback_rate_limit: { blanket_rule: DENY_ALL }"
	)
	runBreakages(t, file, check, []breakage{
		{name: "admits before the first assignment", old: noAssignment, new: strings.Replace(noAssignment, "DENY_ALL", "ALLOW_ALL", 1), want: "no_assignment_behavior must be"},
		{name: "token bucket before the first assignment", old: noAssignment, new: strings.Replace(noAssignment, "{ blanket_rule: DENY_ALL }", "{ token_bucket: { max_tokens: 10, tokens_per_fill: 10, fill_interval: 1s } }", 1), want: "no_assignment_behavior must be"},
		{name: "reuses the last assignment after expiry", old: expiry, new: strings.Replace(expiry, "fallback_rate_limit: { blanket_rule: DENY_ALL }", "reuse_last_assignment: {}", 1), want: "expired_assignment_behavior must be"},
		{name: "expiry timeout Envoy truncates", old: "expired_assignment_behavior_timeout: 10s", new: "expired_assignment_behavior_timeout: 10.5s", want: "whole number of seconds"},
		{name: "no catch-all", old: data[from:to], new: "", want: "no on_no_match"},
		{name: "custom value no predicate guards", old: `regex: ".+"`, new: `regex: ".*"`, all: true, want: "custom_value source_ip is read under no predicate"},
		{name: "custom value in a catch-all", old: "generic_key: { string_value: api }", new: `remote_address: { custom_value: { name: source_ip, typed_config: { "@type": type.googleapis.com/envoy.extensions.matching.common_inputs.network.v3.SourceIPInput } } }`, want: "in an on_no_match catch-all"},
		{name: "bucket id no rule maps", old: "generic_key: { string_value: healthcheck }", new: "generic_key: { string_value: healthz }", want: "maps to no rule"},
		{name: "nested bucket id no rule maps", old: "header_match: { string_value: login }", new: "header_match: { string_value: signin }", want: "header_match=signin"},
		{name: "domain no file defines", old: "domain: edge", new: "domain: edges", all: true, want: "maps to no rule"},
		{name: "reporting interval Envoy ignores", old: "reporting_interval: 5s", new: "reporting_interval: 60s", want: "Envoy reports every 5s"},
		{name: "required field missing inside a typed config", old: "reporting_interval: 5s\n                                    no_assignment_behavior:", new: "no_assignment_behavior:", want: "ReportingInterval: value is required"},
		{name: "misspelt type URL inside a typed config", old: "v3.RateLimitQuotaBucketSettings\n", new: "v3.RateLimitQuotaBucketSetting\n", want: "not a valid Envoy v3 bootstrap"},
		{name: "misspelt field inside a typed config", old: "no_assignment_behavior:", new: "no_assignement_behavior:", want: "not a valid Envoy v3 bootstrap"},
		{name: "misspelt input type", old: "network.v3.SourceIPInput\n", new: "network.v3.SourceIpInput\n", want: "not a valid Envoy v3 bootstrap"},
		{name: "HTTP/1 to a gRPC service", old: "http2_protocol_options: {}", new: "http_protocol_options: {}", want: "HTTP/2"},
		{name: "sidecar on another port", old: "port_value: 8081", new: "port_value: 8082", want: "but sharelimit listens on --grpc-addr 127.0.0.1:8081"},
		{name: "quota service cluster missing", old: "envoy_grpc: { cluster_name: sharelimit }", new: "envoy_grpc: { cluster_name: rlqs }", want: `rlqs_server cluster "rlqs" does not exist`},
		{name: "option Envoy does not implement", old: "domain: edge\n", new: "domain: edge\n                      filter_enabled: { runtime_key: rlqs, default_value: { numerator: 100 } }\n", want: "Envoy does not implement"},
	})
}

func TestDockerfileGuardCatches(t *testing.T) {
	t.Parallel()
	gomod := string(readFile(t, "go.mod"))
	check := func(p *problems, data []byte) { checkDockerfile(p, string(data), gomod) }
	runBreakages(t, "Dockerfile", check, []breakage{
		{name: "runs as root", old: "USER 65532:65532", new: "USER root", want: "numeric non-root"},
		{name: "uid 0", old: "USER 65532:65532", new: "USER 0", want: "numeric non-root"},
		{name: "builds another package", old: "-o /out/sharelimit ./cmd/sharelimit", new: "-o /out/sharelimit ./loadgen", want: "the binary is ./cmd/sharelimit"},
		{name: "final stage with a distribution", old: "FROM gcr.io/distroless/static-debian12:nonroot", new: "FROM debian:12", want: "distroless"},
		{name: "shell-form entrypoint", old: `ENTRYPOINT ["/sharelimit"]`, new: "ENTRYPOINT /sharelimit", want: "exec (JSON array) form"},
		{name: "entrypoint is not the built binary", old: `ENTRYPOINT ["/sharelimit"]`, new: `ENTRYPOINT ["/usr/bin/sharelimit"]`, want: "ENTRYPOINT"},
		{name: "older Go than go.mod", old: "FROM golang:1.26 AS build", new: "FROM golang:1.22 AS build", want: "go.mod asks for"},
		{name: "default command with a flag", old: `CMD ["serve"]`, new: `CMD ["serve", "--config-dir", "/etc/sharelimit/config"]`, want: "would override upstream's variables"},
		{name: "image default with a bad value", old: "SHARELIMIT_STATE_INTERVAL=10s", new: "SHARELIMIT_STATE_INTERVAL=often", want: "SHARELIMIT_STATE_INTERVAL"},
		{name: "no upstream command", old: " && ln -s /sharelimit /out/bin/ratelimit", new: "", want: "no /bin/ratelimit"},
		{name: "upstream command not in /bin", old: "COPY --from=build /out/bin/ /bin/", new: "COPY --from=build /out/bin/ /usr/local/bin/", want: "no /bin/ratelimit"},
		{name: "cgo left on", old: "CGO_ENABLED=0 ", new: "", want: "CGO_ENABLED=0"},
		{name: "binary not copied", old: "COPY --from=build /out/sharelimit /sharelimit", new: "COPY --from=build /out/other /sharelimit", want: "does not copy"},
		{name: "state in the container's own layer", old: `VOLUME ["/var/lib/sharelimit"]`, new: "", want: "not a directory the deployment keeps"},
		{name: "state directory root's", old: "--chown=65532:65532 /out/state", new: "/out/state", want: "could not write its state"},
		{name: "no state file", old: ` SHARELIMIT_STATE_FILE=/var/lib/sharelimit/state`, new: "", want: "no --state-file"},
	})
}

func TestDockerignoreGuardCatches(t *testing.T) {
	t.Parallel()
	inputs := buildInputs(t)
	check := func(p *problems, data []byte) { checkDockerignore(p, dockerignorePatterns(string(data)), inputs) }
	runBreakages(t, ".dockerignore", check, []breakage{
		{name: "a package directory", old: "\nbin\n", new: "\nbin\nconfig\n", want: "config/config.go"},
		{name: "every Go file", old: "**/*_test.go", new: "**/*.go", want: "cmd/sharelimit/main.go"},
		{name: "go.sum", old: "\nbin\n", new: "\nbin\ngo.sum\n", want: "go.sum"},
	})
}

func TestSystemdGuardCatches(t *testing.T) {
	t.Parallel()
	check := func(p *problems, data []byte) { checkUnit(p, string(data)) }
	runBreakages(t, "examples/systemd/sharelimit.service", check, []breakage{
		{name: "static user", old: "DynamicUser=yes", new: "DynamicUser=no", want: "DynamicUser=yes"},
		{name: "admin on every interface", old: "--http-addr 127.0.0.1:8080", new: "--http-addr 0.0.0.0:8080", want: "not a loopback address"},
		{name: "allowed off loopback", old: "--http-addr 127.0.0.1:8080", new: "--http-addr 0.0.0.0:8080 --allow-remote", want: "is not loopback"},
		{name: "stop timeout shorter than the drain", old: "TimeoutStopSec=30s", new: "TimeoutStopSec=10s", want: "TimeoutStopSec"},
		{name: "misspelt flag", old: "--drain 5s", new: "--drain-time 5s", want: "flag provided but not defined"},
		{name: "variable of no flag", old: "SHARELIMIT_REPLICAS=3", new: "SHARELIMIT_REPLICA=3", want: "SHARELIMIT_REPLICA is not"},
		{name: "a reload signal that kills", old: "Restart=on-failure", new: "Restart=on-failure\nExecReload=/bin/kill -HUP $MAINPID", want: "ExecReload"},
		{name: "remote Consul", old: "CONSUL_HTTP_ADDR=127.0.0.1:8500", new: "CONSUL_HTTP_ADDR=10.0.0.5:8500", want: "CONSUL_HTTP_ADDR"},
		{name: "capabilities kept", old: "CapabilityBoundingSet=\n", new: "CapabilityBoundingSet=CAP_NET_ADMIN\n", want: "CapabilityBoundingSet"},
		{name: "no state directory", old: "StateDirectory=sharelimit\n", new: "", want: "not a directory the deployment keeps"},
		{name: "no state file", old: " \\\n    --state-file /var/lib/sharelimit/state \\\n    --state-interval 10s", new: "", want: "no --state-file"},
	})
	data := readFile(t, "examples/systemd/sharelimit.service")
	for _, b := range []breakage{
		{name: "systemd: unknown directive", old: "PrivateDevices=yes", new: "PrivateDevice=yes", want: "Unknown key"},
		{name: "systemd: sandbox removed", old: "# Hardening.", new: "[X-Unhardened]\n# Hardening.", want: "exposure is above 2.0"},
	} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			var p problems
			systemdAnalyze(t, &p, breakFile(t, data, b))
			expectProblem(t, p, b.want)
		})
	}
}

func TestKubernetesGuardCatches(t *testing.T) {
	t.Parallel()
	files := kubernetesFiles(t)
	for _, tc := range []struct {
		file string
		breakage
	}{
		{"daemonset.yaml", breakage{name: "subPath mount", old: "mountPath: /etc/sharelimit/config\n", new: "mountPath: /etc/sharelimit/config\n              subPath: edge.yaml\n", want: "subPath"}},
		{"daemonset.yaml", breakage{name: "probe at the loopback admin port", old: "port: health", new: "port: 8080", want: "admin listener is on loopback"}},
		{"daemonset.yaml", breakage{name: "variable of no flag", old: "name: SHARELIMIT_NODE\n", new: "name: SHARELIMIT_NODENAME\n", want: "SHARELIMIT_NODENAME is not"}},
		{"daemonset.yaml", breakage{name: "misspelt field", old: "readOnlyRootFilesystem: true", new: "readOnlyRootFileSystem: true", want: "readOnlyRootFileSystem not found"}},
		{"daemonset.yaml", breakage{name: "writable root", old: "readOnlyRootFilesystem: true", new: "readOnlyRootFilesystem: false", want: "readOnlyRootFilesystem"}},
		{"daemonset.yaml", breakage{name: "grace shorter than the drain", old: "terminationGracePeriodSeconds: 30", new: "terminationGracePeriodSeconds: 10", want: "terminationGracePeriodSeconds"}},
		{"daemonset.yaml", breakage{name: "Consul elsewhere", old: "value: $(HOST_IP):8500", new: "value: consul.service.consul:8500", want: "CONSUL_HTTP_ADDR"}},
		{"daemonset.yaml", breakage{name: "node name not the node's", old: "fieldRef: { fieldPath: spec.nodeName }", new: "fieldRef: { fieldPath: metadata.name }", want: "--node"}},
		{"daemonset.yaml", breakage{name: "registered under another name", old: `"name": "edge-gateway"`, new: `"name": "gateway"`, want: "registered service name"}},
		{"daemonset.yaml", breakage{name: "config mounted elsewhere", old: "mountPath: /etc/sharelimit/config\n", new: "mountPath: /etc/sharelimit/rules\n", want: "nothing is mounted there"}},
		{"daemonset.yaml", breakage{name: "flag with a bad value", old: "value: json", new: "value: yaml", want: "--log-format"}},
		{"daemonset.yaml", breakage{name: "state in memory", old: "          emptyDir:\n            sizeLimit: 64Mi", new: "          emptyDir:\n            medium: Memory\n            sizeLimit: 64Mi", want: "not a directory the deployment keeps"}},
		{"daemonset.yaml", breakage{name: "no state file", old: "            - --state-file\n            - /var/lib/sharelimit/state\n", new: "", want: "no --state-file"}},
		{"daemonset.yaml", breakage{name: "no scrape annotation", old: "        prometheus.io/scrape: \"true\"\n", new: "", want: "Prometheus has no way"}},
		{"daemonset.yaml", breakage{name: "metrics on loopback", old: "- 0.0.0.0:9090", new: "- 127.0.0.1:9090", want: "is on loopback"}},
		{"daemonset.yaml", breakage{name: "no metrics listener", old: "            - --metrics-addr\n            - 0.0.0.0:9090\n", new: "", want: "no --metrics-addr"}},
		{"daemonset.yaml", breakage{name: "scrape port not the listener's", old: `prometheus.io/port: "9090"`, new: `prometheus.io/port: "8080"`, want: "prometheus.io/port"}},
		{"daemonset.yaml", breakage{name: "metrics port unnamed", old: "- name: metrics\n              containerPort: 9090", new: "- containerPort: 9090", want: "named port"}},
		{"daemonset.yaml", breakage{name: "scrape path not served", old: "prometheus.io/path: /metrics", new: "prometheus.io/path: /stats", want: "--metrics-path"}},
		{"descriptors-configmap.yaml", breakage{name: "ConfigMap drifted from examples/config", old: "requests_per_unit: 50", new: "requests_per_unit: 55", want: "no longer compiles"}},
		{"descriptors-configmap.yaml", breakage{name: "ConfigMap that fails check", old: "unit: second", new: "unit: fortnight", want: "invalid rate limit unit"}},
		{"envoy-configmap.yaml", breakage{name: "Envoy on another port", old: "port_value: 8081", new: "port_value: 8089", want: "points at"}},
		{"envoy-configmap.yaml", breakage{name: "health listener passes everything", old: "path: /healthcheck\n", new: "prefix: /\n", want: "only the exact path /healthcheck"}},
		{"envoy-configmap.yaml", breakage{name: "health listener on loopback", old: "address: 0.0.0.0, port_value: 9902", new: "address: 127.0.0.1, port_value: 9902", want: "no Envoy HTTP listener the kubelet can reach"}},
		{"kustomization.yaml", breakage{name: "a manifest left out", old: "  - daemonset.yaml\n", new: "", want: "daemonset.yaml is not among its resources"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			broken := map[string][]byte{}
			for k, v := range files {
				broken[k] = v
			}
			broken[tc.file] = breakFile(t, files[tc.file], tc.breakage)
			var p problems
			checkKubernetes(&p, broken)
			expectProblem(t, p, tc.want)
		})
	}
}

func TestGrafanaGuardCatches(t *testing.T) {
	t.Parallel()
	got := scrapeRunningDaemon(t)
	check := func(p *problems, data []byte) { checkDashboard(p, data, got) }
	runBreakages(t, "examples/grafana/sharelimit.json", check, []breakage{
		{name: "misspelt metric", old: `sharelimit_decisions_total{code=\"OVER_LIMIT\"`, new: `sharelimit_decision_total{code=\"OVER_LIMIT\"`, want: "sharelimit_decision_total: the daemon exports no such series"},
		{name: "value the daemon never exports", old: `code=\"OVER_LIMIT\"`, new: `code=\"OVERLIMIT\"`, want: "no such value"},
		{name: "label the metric lacks", old: `sharelimit_decisions_total{code=`, new: `sharelimit_decisions_total{status=`, want: `has no label "status"`},
		{name: "group by a label nobody has", old: "sum by (code)", new: "sum by (status)", want: `groups by "status"`},
		{name: "misspelt function", old: "histogram_quantile(0.5", new: "histogram_quantil(0.5", want: "not a PromQL function"},
		{name: "hard-wired data source", old: `"uid": "${datasource}"`, new: `"uid": "prom"`, want: "use ${datasource}"},
		{name: "panel family dropped", old: "sharelimit_panics_total", new: "sharelimit_no_limit_total", all: true, want: "no panel shows sharelimit_panics_total"},
		{name: "unbalanced query", old: "histogram_quantile(0.5, ", new: "histogram_quantile((0.5, ", want: "unbalanced"},
	})
}
