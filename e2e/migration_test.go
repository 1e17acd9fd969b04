package e2e

import (
	"context"
	"encoding/json"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sharelimit/sharelimit/internal/dockerfile"
)

// The migration test runs the real binary as upstream's own deployments run
// upstream's image, with only the image changed: the command, the
// environment variable for variable, the volume where the rules are, and the
// image's own entrypoint and environment read from our Dockerfile. Docker
// cannot run here, so the test plays the container runtime: it makes the
// image's paths (a temporary directory stands for the image's root and each
// volume) and execs what the runtime would.
//
// The environments below are written from envoyproxy/ratelimit's files: the
// ratelimit service of its docker-compose.yml, and a Deployment as its
// README's Kubernetes notes describe one (a ConfigMap of rules at
// RUNTIME_ROOT/RUNTIME_SUBDIRECTORY/config, Redis by URL, statsd off), with
// the variables Kubernetes itself injects.

// upstreamCompose is the environment of the ratelimit service in upstream's
// docker-compose.yml; its command is /bin/ratelimit and it mounts
// ./examples at /data.
var upstreamCompose = []string{
	"USE_STATSD=false",
	"LOG_LEVEL=debug",
	"REDIS_SOCKET_TYPE=tcp",
	"REDIS_URL=redis:6379",
	"RUNTIME_ROOT=/data",
	"RUNTIME_SUBDIRECTORY=ratelimit",
	"MEMCACHE_HOST_PORT=memcached:11211",
}

// upstreamKubernetes is a typical Deployment's container environment, with
// upstream's usual LOG_LEVEL=warn, JSON logs, and what the kubelet injects
// for the namespace's Services (redis among them); its command is
// ["/bin/ratelimit"] and a ConfigMap is mounted at /data/ratelimit/config.
var upstreamKubernetes = []string{
	"LOG_LEVEL=warn",
	"LOG_FORMAT=json",
	"RUNTIME_ROOT=/data",
	"RUNTIME_SUBDIRECTORY=ratelimit",
	"RUNTIME_WATCH_ROOT=false",
	"RUNTIME_IGNOREDOTFILES=true",
	"USE_STATSD=false",
	"REDIS_SOCKET_TYPE=tcp",
	"REDIS_URL=redis.default.svc.cluster.local:6379",
	"HOSTNAME=ratelimit-7c9f8d6b5-x2x4q",
	"KUBERNETES_SERVICE_HOST=10.96.0.1",
	"KUBERNETES_SERVICE_PORT=443",
	"KUBERNETES_PORT=tcp://10.96.0.1:443",
	"REDIS_SERVICE_HOST=10.96.12.7",
	"REDIS_SERVICE_PORT=6379",
	"REDIS_PORT=tcp://10.96.12.7:6379",
	"REDIS_PORT_6379_TCP=tcp://10.96.12.7:6379",
}

// migrationNetNS, set to "force", runs TestMigration in a network namespace
// of its own even on a machine with a non-loopback address, as it runs on a
// machine without one. Set to "inside", it marks the run inside the
// namespace.
const migrationNetNS = "SHARELIMIT_MIGRATION_NETNS"

// TestMigration: upstream's docker-compose.yml and a typical Deployment, with
// only the image changed, serve: the three ports on a non-loopback address
// (gRPC 8081 answers with the rules in force, 8080 /healthcheck, 6070
// upstream's /rlconfig), the image's healthcheck passes, and at
// LOG_LEVEL=warn the operator sees, as WARN records, each listener beyond
// loopback, the variables ignored and, with no membership variable, that
// every replica enforces every limit whole. One membership variable
// (SHARELIMIT_PEERS_DNS, or SHARELIMIT_REPLICAS) clears that fault.
func TestMigration(t *testing.T) {
	addr := nonLoopbackAddr()
	if os.Getenv(migrationNetNS) == "force" || addr == "" {
		runInNetNS(t)
		return
	}
	img := imageOf(t)

	type scenario struct {
		name string
		// command replaces the image's CMD (compose's command:) or, with
		// entrypoint, its ENTRYPOINT too (Kubernetes' command:).
		command    []string
		entrypoint bool
		env        []string
		configMap  bool // the rules as a Kubernetes ConfigMap volume lays them out
		fault      bool // the unshared fault, and its WARN
	}
	for _, sc := range []scenario{
		{name: "compose", command: []string{"/bin/ratelimit"}, env: upstreamCompose, fault: true},
		{name: "compose+replicas", command: []string{"ratelimit"}, env: append(slices.Clone(upstreamCompose), "SHARELIMIT_REPLICAS=3")},
		{name: "compose+peers-dns", command: []string{"/bin/ratelimit"}, env: append(slices.Clone(upstreamCompose), "SHARELIMIT_PEERS_DNS=localhost")},
		{name: "kubernetes", command: []string{"/bin/ratelimit"}, entrypoint: true, env: upstreamKubernetes, configMap: true, fault: true},
		{name: "kubernetes+peers-dns", command: []string{"/bin/ratelimit"}, entrypoint: true, env: append(slices.Clone(upstreamKubernetes), "SHARELIMIT_PEERS_DNS=localhost"), configMap: true},
	} {
		t.Run(sc.name, func(t *testing.T) {
			root := newImageRoot(t, sc.configMap)
			argv := slices.Concat(img.Entrypoint, img.Cmd)
			if sc.entrypoint {
				argv = sc.command
			} else if sc.command != nil {
				argv = slices.Concat(img.Entrypoint, sc.command)
			}
			env := []string{"PATH=/usr/bin:/bin"}
			for _, kv := range img.Env {
				env = append(env, kv[0]+"="+kv[1])
			}
			env = append(env, sc.env...)
			p := root.start(t, argv, env)

			grpcAddr, httpAddr, debugAddr := net.JoinHostPort(addr, "8081"), net.JoinHostPort(addr, "8080"), net.JoinHostPort(addr, "6070")
			p.awaitHealthy(t, "/healthcheck on the pod's address, port 8080", httpAddr)

			// The rules in force, over gRPC on 8081: the rule's limit in every
			// answer, and, where this replica enforces it whole, its count.
			// (With a membership variable its share is smaller and starts
			// with the join ramp: this replica joins replicas that serve.)
			rls := rlsClient(t, grpcAddr)
			ok := 0
			for range 4 {
				resp, err := rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge",
					Descriptors: []*commonv3.RateLimitDescriptor{{Entries: []*commonv3.RateLimitDescriptor_Entry{{Key: "remote_address", Value: "10.0.0.1"}}}}})
				if err != nil {
					t.Fatalf("ShouldRateLimit on %s: %v", grpcAddr, err)
				}
				if l := resp.GetStatuses()[0].GetCurrentLimit(); l.GetRequestsPerUnit() != 3 || l.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
					t.Fatalf("edge remote_address: current limit %v, want the rule's 3 per minute", l)
				}
				if resp.OverallCode == rlsv3.RateLimitResponse_OK {
					ok++
				}
			}
			if sc.fault && ok != 3 || ok > 3 {
				t.Errorf("edge remote_address: %d of 4 admitted, want the rule's 3 (whole: %v)", ok, sc.fault)
			}

			// Upstream's /rlconfig on 6070.
			code, body, err := httpGet("http://" + debugAddr + "/rlconfig")
			if want := "edge.path_/login: unit=MINUTE requests_per_unit=2, shadow_mode: false, quota_mode: false\n"; err != nil || code != 200 || !strings.Contains(body, want) {
				t.Errorf("/rlconfig on %s: %d %v\n%s\nwant a line %q", debugAddr, code, err, body, want)
			}
			if sc.fault != strings.Contains(body, "fault=unshared") {
				t.Errorf("/rlconfig on %s: the unshared fault shown=%v, want %v:\n%s", debugAddr, !sc.fault, sc.fault, body)
			}

			// Beyond loopback the admin port serves what upstream's 8080
			// does, /healthcheck and /json, and no other page.
			for _, page := range []string{"/", "/rlconfig", "/metrics", "/debug/pprof/"} {
				if code, _, err := httpGet("http://" + httpAddr + page); err != nil || code != 404 {
					t.Errorf("%s on the admin port beyond loopback: %d %v, want 404", page, code, err)
				}
			}

			// ... and the loopback admin listener serves them all.
			if code, body, err := httpGet("http://127.0.0.1:8082/rlconfig"); err != nil || code != 200 || !strings.Contains(body, "membership: source=") {
				t.Errorf("/rlconfig on the loopback admin listener 127.0.0.1:8082: %d %v\n%s", code, err, body)
			}

			// The image's HEALTHCHECK, in the container's environment.
			hc := exec.Command(root.path(img.healthcheck[0]), img.healthcheck[1:]...)
			hc.Env = root.mapEnv(env)
			if out, err := hc.CombinedOutput(); err != nil {
				t.Errorf("the image's HEALTHCHECK %v: %v\n%s", img.healthcheck, err, out)
			}

			warns := p.records(t, sc.env)
			for _, l := range []string{"grpc", "http", "debug"} {
				if !slices.ContainsFunc(warns, func(r string) bool {
					return strings.Contains(r, "listening on a non-loopback address") && (strings.Contains(r, "listener="+l) || strings.Contains(r, `"listener":"`+l+`"`))
				}) {
					t.Errorf("no WARN for the %s listener beyond loopback:\n%s", l, strings.Join(warns, "\n"))
				}
			}
			if !slices.ContainsFunc(warns, func(r string) bool {
				return strings.Contains(r, "upstream variables ignored") && strings.Contains(r, "REDIS_URL")
			}) {
				t.Errorf("no WARN naming the ignored variables:\n%s", strings.Join(warns, "\n"))
			}
			faulted := slices.ContainsFunc(warns, func(r string) bool {
				return strings.Contains(r, "every replica enforces every limit whole") && strings.Contains(r, "SHARELIMIT_PEERS_DNS")
			})
			if faulted != sc.fault {
				t.Errorf("WARN that every replica enforces every limit whole: %v, want %v:\n%s", faulted, sc.fault, strings.Join(warns, "\n"))
			}
		})
	}
}

// image is what the Dockerfile gives a container, and its healthcheck.
type image struct {
	dockerfile.Image
	healthcheck []string
}

// imageOf reads the final stage of the repository's Dockerfile.
func imageOf(t *testing.T) image {
	t.Helper()
	data, err := os.ReadFile("../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	stages := dockerfile.Parse(string(data))
	img, err := dockerfile.Final(stages)
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	out := image{Image: img}
	for _, in := range stages[len(stages)-1].Body {
		if in.Cmd == "HEALTHCHECK" {
			_, cmd, ok := strings.Cut(in.Args, "CMD ")
			if !ok {
				t.Fatalf("Dockerfile: HEALTHCHECK %s: no CMD", in.Args)
			}
			if out.healthcheck, err = dockerfile.ExecForm(dockerfile.Instruction{Cmd: "HEALTHCHECK", Args: cmd}); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(out.Entrypoint) == 0 || len(out.healthcheck) == 0 {
		t.Fatalf("Dockerfile: entrypoint %v, healthcheck %v", out.Entrypoint, out.healthcheck)
	}
	return out
}

// imageRoot stands for the container's filesystem: the image's paths and
// each volume are directories under one temporary root.
type imageRoot struct{ dir string }

// newImageRoot lays out the image (/sharelimit, and /bin/ratelimit linked to
// it as the Dockerfile links it), its state volume, and the rules volume at
// /data/ratelimit/config: as compose's bind mount lays it out, or, with
// configMap, as the kubelet lays out a ConfigMap (each file a link into a
// hidden timestamped directory, through ..data).
func newImageRoot(t *testing.T, configMap bool) imageRoot {
	t.Helper()
	r := imageRoot{dir: t.TempDir()}
	for _, d := range []string{"bin", "var/lib/sharelimit", "data/ratelimit/config"} {
		if err := os.MkdirAll(r.path("/"+d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.Symlink(sharelimitBin(t), r.path("/sharelimit")))
	must(os.Symlink(r.path("/sharelimit"), r.path("/bin/ratelimit")))
	dir := r.path("/data/ratelimit/config")
	files := map[string]string{"config.yaml": upstreamRules["config.yaml"], "api.yaml": upstreamRules["extra"]}
	if !configMap {
		for name, body := range files {
			must(os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644))
		}
		return r
	}
	stamp := "..2026_12_04_21_00_00.123456789"
	must(os.Mkdir(filepath.Join(dir, stamp), 0o755))
	for name, body := range files {
		must(os.WriteFile(filepath.Join(dir, stamp, name), []byte(body), 0o644))
		must(os.Symlink(filepath.Join("..data", name), filepath.Join(dir, name)))
	}
	must(os.Symlink(stamp, filepath.Join(dir, "..data")))
	return r
}

// path maps a path in the container to the directory standing for it.
func (r imageRoot) path(p string) string { return filepath.Join(r.dir, p) }

// mapEnv maps the container paths in variables' values (/data, /var/lib/...)
// to the directories standing for them.
func (r imageRoot) mapEnv(env []string) []string {
	out := make([]string, len(env))
	for i, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(v, "/data") || strings.HasPrefix(v, "/var/lib/sharelimit") {
			v = r.path(v)
		}
		out[i] = k + "=" + v
	}
	return out
}

// start execs argv as the runtime would: argv[0] is a path in the image, and
// the process sees its own name as the runtime gives it.
func (r imageRoot) start(t *testing.T, argv, env []string) *proc {
	t.Helper()
	logf, err := os.CreateTemp(t.TempDir(), "sharelimit-*.log")
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	args := slices.Clone(argv[1:])
	for i, a := range args {
		if a == "/bin/ratelimit" {
			args[i] = r.path(a) // compose's command, a path in the image
		}
	}
	p := &proc{cmd: exec.Command(r.path(argv[0]), args...), log: logf.Name(), done: make(chan struct{})}
	p.cmd.Env = r.mapEnv(env)
	p.cmd.Stdout, p.cmd.Stderr = logf, logf
	configureProcess(p.cmd)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	t.Cleanup(func() {
		p.cmd.Process.Kill()
		<-p.done
	})
	return p
}

// records returns the process's log records at WARN and above, failing the
// test on any below WARN when the environment asks for LOG_LEVEL=warn, and on
// any line that is not JSON when it asks for LOG_FORMAT=json.
func (p *proc) records(t *testing.T, env []string) []string {
	t.Helper()
	data, err := os.ReadFile(p.log)
	if err != nil {
		t.Fatal(err)
	}
	warnOnly, asJSON := slices.Contains(env, "LOG_LEVEL=warn"), slices.Contains(env, "LOG_FORMAT=json")
	var out []string
	for _, line := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		level := ""
		if asJSON {
			// Upstream's field names, as its logger wrote JSON.
			var rec struct {
				Level     string `json:"level"`
				Message   string `json:"@message"`
				Timestamp string `json:"@timestamp"`
			}
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Errorf("LOG_FORMAT=json, and a line is not JSON: %q", line)
				continue
			}
			if rec.Message == "" || rec.Timestamp == "" {
				t.Errorf("LOG_FORMAT=json in upstream's deployment, and a record without @message and @timestamp: %s", line)
			}
			level = map[string]string{"warning": "WARN", "error": "ERROR", "info": "INFO", "debug": "DEBUG"}[rec.Level]
		} else if _, rest, ok := strings.Cut(line, " level="); ok {
			level, _, _ = strings.Cut(rest, " ")
		}
		switch level {
		case "WARN", "ERROR":
			out = append(out, line)
		default:
			if warnOnly {
				t.Errorf("LOG_LEVEL=warn, and a record at %s: %s", level, line)
			}
		}
	}
	return out
}

// nonLoopbackAddr is one of this machine's addresses that is not loopback,
// IPv4 first, or "" if it has none.
func nonLoopbackAddr() string {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return ""
	}
	var v6 string
	for _, a := range addrs {
		ip, ok := a.(*net.IPNet)
		if !ok || !ip.IP.IsGlobalUnicast() {
			continue
		}
		if ip.IP.To4() != nil {
			return ip.IP.String()
		}
		if v6 == "" {
			v6 = ip.IP.String()
		}
	}
	return v6
}

// runInNetNS runs TestMigration again in a network namespace of its own
// (unshare(1), as root), where loopback also carries 10.213.0.1: an address
// that is not loopback, on a machine that has none.
func runInNetNS(t *testing.T) {
	if os.Getenv(migrationNetNS) == "inside" {
		t.Fatal("inside the network namespace, and still no address beyond loopback")
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--net", "--", "sh", "-c",
		`ip link set lo up && ip addr add 10.213.0.1/32 dev lo && exec "$@"`, "sh",
		bin, "-test.run", "^TestMigration$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), migrationNetNS+"=inside", binEnv+"="+sharelimitBin(t))
	out, err := cmd.CombinedOutput()
	t.Logf("in a network namespace with 10.213.0.1 on loopback:\n%s", out)
	if err != nil {
		t.Fatalf("TestMigration in a network namespace: %v", err)
	}
	if !strings.Contains(string(out), "--- PASS: TestMigration ") {
		t.Fatalf("TestMigration did not pass in the network namespace:\n%s", out)
	}
}
