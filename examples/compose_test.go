package examples_test

import (
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// composeService is the part of a compose service these checks read.
type composeService struct {
	name        string
	image       string
	build       string // the build context, "" without one
	command     []string
	env         map[string]string
	volumes     []composeVolume
	ports       []composePort
	networkMode string
	stopGrace   time.Duration
}

type composeVolume struct {
	source, target string // source as written: relative to the compose file
	readOnly       bool
}

type composePort struct{ published, target int }

// parseCompose reads a compose file (anchors and merge keys resolved, as
// compose does) into its services.
func parseCompose(p *problems, data []byte) map[string]*composeService {
	var doc struct {
		Services map[string]map[string]any `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil {
		p.addf("docker-compose.yml: %v", err)
		return nil
	}
	out := map[string]*composeService{}
	for name, raw := range doc.Services {
		s := &composeService{name: name, env: map[string]string{}, stopGrace: 10 * time.Second} // compose's default grace
		where := "docker-compose.yml: " + name
		s.image, _ = raw["image"].(string)
		switch b := raw["build"].(type) {
		case string:
			s.build = b
		case map[string]any:
			s.build, _ = b["context"].(string)
		}
		switch c := raw["command"].(type) {
		case string:
			s.command = strings.Fields(c)
		case []any:
			for _, a := range c {
				s.command = append(s.command, fmt.Sprint(a))
			}
		}
		switch e := raw["environment"].(type) {
		case map[string]any:
			for k, v := range e {
				s.env[k] = fmt.Sprint(v)
			}
		case []any:
			for _, kv := range e {
				k, v, _ := strings.Cut(fmt.Sprint(kv), "=")
				s.env[k] = v
			}
		}
		vols, _ := raw["volumes"].([]any)
		for _, v := range vols {
			str, ok := v.(string)
			if !ok {
				p.addf("%s: write volumes as source:target[:ro] for this check", where)
				continue
			}
			parts := strings.Split(str, ":")
			if len(parts) < 2 {
				p.addf("%s: volume %q: want source:target", where, str)
				continue
			}
			s.volumes = append(s.volumes, composeVolume{source: parts[0], target: parts[1], readOnly: len(parts) > 2 && strings.Contains(parts[2], "ro")})
		}
		ports, _ := raw["ports"].([]any)
		for _, v := range ports {
			parts := strings.Split(fmt.Sprint(v), ":")
			if len(parts) < 2 {
				p.addf("%s: port %v: publish as [ip:]host:container", where, v)
				continue
			}
			pub, err1 := strconv.Atoi(parts[len(parts)-2])
			tgt, err2 := strconv.Atoi(strings.TrimSuffix(parts[len(parts)-1], "/tcp"))
			if err1 != nil || err2 != nil {
				p.addf("%s: port %v: want numbers", where, v)
				continue
			}
			s.ports = append(s.ports, composePort{published: pub, target: tgt})
		}
		s.networkMode, _ = raw["network_mode"].(string)
		if g, ok := raw["stop_grace_period"].(string); ok {
			d, err := time.ParseDuration(g)
			if err != nil {
				p.addf("%s: stop_grace_period %q: %v", where, g, err)
			}
			s.stopGrace = d
		}
		out[name] = s
	}
	return out
}

// mount finds the volume a container path lives in and returns the repository
// path behind it.
func (s *composeService) mount(target string) (string, composeVolume, bool) {
	for _, v := range s.volumes {
		if target == v.target || strings.HasPrefix(target, v.target+"/") {
			return filepath.Join(repo, v.source, strings.TrimPrefix(target, v.target)), v, true
		}
	}
	return "", composeVolume{}, false
}

// flagValue returns the value of -name=value or -name value in a Go-style
// command line (Consul's and Envoy's).
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		a = "-" + strings.TrimLeft(a, "-")
		if v, ok := strings.CutPrefix(a, "-"+name+"="); ok {
			return v, true
		}
		if a == "-"+name && i+1 < len(args) {
			return args[i+1], true
		}
	}
	return "", false
}

func hasFlag(args []string, name string) bool {
	for _, a := range args {
		if "-"+strings.TrimLeft(a, "-") == "-"+name {
			return true
		}
	}
	return false
}

// checkCompose checks docker-compose.yml against the real daemon and the files
// it mounts. It is the compose topology, node by node: an Envoy owning a network
// namespace; in it a sharelimit sidecar, a Consul client agent and the
// upstream.
func checkCompose(p *problems, data []byte) {
	services := parseCompose(p, data)
	if services == nil {
		return
	}
	for _, s := range services {
		if s.build == "" && (s.image == "" || !strings.Contains(s.image, ":") || strings.HasSuffix(s.image, ":latest")) {
			p.addf("docker-compose.yml: %s: image %q: pin a tag", s.name, s.image)
		}
	}
	var sidecars []*composeService
	for _, name := range sortedKeys(services) {
		if services[name].build != "" {
			sidecars = append(sidecars, services[name])
		}
	}
	if len(sidecars) < 2 {
		p.addf("docker-compose.yml: %d sharelimit services (with build:); the demo needs at least two nodes to divide limits among", len(sidecars))
	}
	nodes := map[string]string{} // Consul node name -> service
	for _, s := range sidecars {
		checkComposeNode(p, services, s, len(sidecars), nodes)
	}
}

func checkComposeNode(p *problems, services map[string]*composeService, s *composeService, nodeCount int, nodes map[string]string) {
	where := "docker-compose.yml: " + s.name
	if filepath.Clean(s.build) != "." {
		p.addf("%s: build: %q; the Dockerfile is at the repository root (build: .)", where, s.build)
	}
	mounts := map[string]string{}
	for _, v := range s.volumes {
		mounts[v.target] = filepath.Join(repo, v.source)
	}
	states := map[string]bool{}
	for _, v := range s.volumes {
		if !v.readOnly && !strings.HasPrefix(v.source, ".") && !strings.HasPrefix(v.source, "/") {
			states[v.target] = true // a named volume, writable: it outlives the container
		}
	}
	cfg := checkDaemon(p, daemon{where: where, args: s.command, env: s.env, mounts: mounts, stateDirs: states})
	if cfg == nil {
		return
	}
	if dir, v, ok := s.mount(cfg.ConfigDir); ok {
		if !v.readOnly {
			p.addf("%s: mount %s read-only (:ro)", where, v.target)
		}
		checkDescriptors(p, where, dir)
	}
	if s.stopGrace <= stopBudget(cfg) {
		p.addf("%s: stop_grace_period %s does not outlast --drain %s + --shutdown-timeout %s: docker would SIGKILL mid-drain", where, s.stopGrace, cfg.Drain, cfg.ShutdownTimeout)
	}
	if cfg.ConsulService != "" && cfg.Replicas != nodeCount {
		p.addf("%s: --replicas %d: the demo has %d nodes, and --replicas is the count until Consul first answers", where, cfg.Replicas, nodeCount)
	}

	// The Envoy that owns the namespace, and asks this sidecar.
	owner, ok := strings.CutPrefix(s.networkMode, "service:")
	envoy := services[owner]
	if !ok || envoy == nil {
		p.addf("%s: network_mode %q: want service:<the node's Envoy>, so Envoy reaches the sidecar on loopback", where, s.networkMode)
		return
	}
	ewhere := "docker-compose.yml: " + envoy.name
	if !strings.HasPrefix(envoy.image, "envoyproxy/envoy:") {
		p.addf("%s: image %q: want the official envoyproxy/envoy", ewhere, envoy.image)
	}
	bootstrap, ok := flagValue(envoy.command, "c")
	if !ok {
		p.addf("%s: command %v: no -c bootstrap", ewhere, envoy.command)
		return
	}
	file, _, ok := envoy.mount(bootstrap)
	if !ok {
		p.addf("%s: the bootstrap %s is not mounted from the repository", ewhere, bootstrap)
		return
	}
	data, err := os.ReadFile(file)
	if err != nil {
		p.addf("%s: %v", ewhere, err)
		return
	}
	configDir, _, _ := s.mount(cfg.ConfigDir)
	ec := checkEnvoy(p, ewhere+": "+bootstrap, data, envoyWant{grpcAddr: cfg.GRPCAddr, configDir: configDir, replicas: cfg.Replicas})
	if ec == nil {
		return
	}
	published := false
	for _, port := range envoy.ports {
		l := ec.listener(port.target)
		switch {
		case l == nil:
			p.addf("%s: publishes %d:%d, but no listener in %s is on %d", ewhere, port.published, port.target, bootstrap, port.target)
		case isLoopbackAddr(l.addr):
			p.addf("%s: publishes %d:%d, but listener %s is on loopback, which a published port never reaches", ewhere, port.published, port.target, l.addr)
		case l.rateLimit != nil:
			published = true
		}
	}
	if !published {
		p.addf("%s: publishes no listener that asks sharelimit", ewhere)
	}

	// The rest of the namespace: the Consul client agent and the upstream.
	var agent, upstream *composeService
	for _, name := range sortedKeys(services) {
		o := services[name]
		if o.networkMode != s.networkMode || o == s {
			continue
		}
		switch {
		case strings.HasPrefix(o.image, "hashicorp/consul:"):
			agent = o
		case strings.HasPrefix(o.image, "nginx:"):
			upstream = o
		}
	}
	if upstream == nil {
		p.addf("%s: no upstream (nginx) in %s's network namespace", where, owner)
	} else {
		checkComposeUpstream(p, ec, upstream)
	}
	if cfg.ConsulService == "" {
		return
	}
	if agent == nil {
		p.addf("%s: --consul-service %s, but no Consul client agent shares %s's network namespace", where, cfg.ConsulService, owner)
		return
	}
	checkComposeAgent(p, services, agent, s.env, cfg.ConsulService, ec, nodes)
}

// checkComposeAgent checks a node's Consul client agent: it is where
// CONSUL_HTTP_ADDR points, it joins the server, and it registers the service
// sharelimit counts, with a check that reaches something real.
func checkComposeAgent(p *problems, services map[string]*composeService, agent *composeService, env map[string]string, service string, ec *envoyConfig, nodes map[string]string) {
	where := "docker-compose.yml: " + agent.name
	args := agent.command
	if len(args) == 0 || args[0] != "agent" || hasFlag(args, "server") {
		p.addf("%s: command %v: want a client agent (agent, no -server)", where, args)
	}
	httpPort := "8500"
	if v, ok := flagValue(args, "http-port"); ok {
		httpPort = v
	}
	if addr := env["CONSUL_HTTP_ADDR"]; addr != net.JoinHostPort("127.0.0.1", httpPort) {
		p.addf("%s: the sidecar's CONSUL_HTTP_ADDR is %q, but this agent's HTTP API is 127.0.0.1:%s", where, addr, httpPort)
	}
	node, ok := flagValue(args, "node")
	switch {
	case !ok:
		p.addf("%s: no -node: the agent would take the container's random hostname", where)
	case nodes[node] != "":
		p.addf("%s: -node %s is also %s's: each app node needs its own", where, node, nodes[node])
	default:
		nodes[node] = agent.name
	}
	join, _ := flagValue(args, "retry-join")
	if server := services[join]; server == nil || !hasFlag(server.command, "server") {
		p.addf("%s: -retry-join %q is not a Consul server service", where, join)
	}
	defFile, ok := flagValue(args, "config-file")
	if !ok {
		p.addf("%s: no -config-file with the %s service definition", where, service)
		return
	}
	file, _, ok := agent.mount(defFile)
	if !ok {
		p.addf("%s: %s is not mounted from the repository", where, defFile)
		return
	}
	data, err := os.ReadFile(file)
	if err != nil {
		p.addf("%s: %v", where, err)
		return
	}
	var def struct {
		Service struct {
			Name  string `json:"name"`
			Port  int    `json:"port"`
			Check struct {
				HTTP     string `json:"http"`
				Interval string `json:"interval"`
			} `json:"check"`
		} `json:"service"`
	}
	if err := json.Unmarshal(data, &def); err != nil {
		p.addf("%s: %v", file, err)
		return
	}
	if def.Service.Name != service {
		p.addf("%s: registers %q, but sharelimit counts --consul-service %s", file, def.Service.Name, service)
	}
	u, err := url.Parse(def.Service.Check.HTTP)
	if err != nil || def.Service.Check.HTTP == "" || def.Service.Check.Interval == "" {
		p.addf("%s: want an HTTP check with an interval, got %q every %q", file, def.Service.Check.HTTP, def.Service.Check.Interval)
		return
	}
	port, _ := strconv.Atoi(u.Port())
	if !isLoopbackAddr(u.Host) {
		p.addf("%s: the check %s should stay in the node's namespace (loopback)", file, u)
	}
	l := ec.listener(port)
	if l == nil || l.hcm == nil {
		p.addf("%s: the check %s reaches no Envoy listener", file, u)
		return
	}
	if r := l.route(u.Path); r == nil || ec.clusters[r.GetRoute().GetCluster()] == nil {
		p.addf("%s: the check %s matches no route to a cluster", file, u)
	}
}

var nginxListen = regexp.MustCompile(`(?m)^\s*listen\s+(\d+)\s*;`)

// checkComposeUpstream checks the node's loopback clusters (other than
// sharelimit's) reach the port the upstream listens on.
func checkComposeUpstream(p *problems, ec *envoyConfig, upstream *composeService) {
	where := "docker-compose.yml: " + upstream.name
	listening := map[string]bool{}
	for _, v := range upstream.volumes {
		if !strings.HasPrefix(v.target, "/etc/nginx/") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(repo, v.source))
		if err != nil {
			p.addf("%s: %v", where, err)
			continue
		}
		for _, m := range nginxListen.FindAllStringSubmatch(string(data), -1) {
			listening[m[1]] = true
		}
	}
	if len(listening) == 0 {
		p.addf("%s: no nginx config with a listen directive is mounted", where)
		return
	}
	for _, name := range sortedKeys(ec.clusters) {
		if name == "sharelimit" {
			continue
		}
		for _, ep := range ec.endpoints(name) {
			host, port, err := net.SplitHostPort(ep)
			if err == nil && isLoopbackAddr(ep) && !listening[port] {
				p.addf("%s: Envoy's cluster %s goes to %s, but nginx listens on %v", where, name, net.JoinHostPort(host, port), sortedKeys(listening))
			}
		}
	}
}

func TestCompose(t *testing.T) {
	t.Parallel()
	var p problems
	checkCompose(&p, readFile(t, "docker-compose.yml"))
	p.report(t)
}

// TestComposeReadme checks the compose README only names services that exist.
func TestComposeReadme(t *testing.T) {
	t.Parallel()
	var p problems
	services := parseCompose(&p, readFile(t, "docker-compose.yml"))
	readme := string(readFile(t, "examples/compose/README.md"))
	for _, m := range regexp.MustCompile(`docker compose (?:exec|stop|start|logs|restart)(?: -T)? ([a-z0-9-]+)`).FindAllStringSubmatch(readme, -1) {
		if services[m[1]] == nil {
			p.addf("examples/compose/README.md: %q names no service in docker-compose.yml", m[0])
		}
	}
	for _, m := range regexp.MustCompile(`localhost:(\d+)`).FindAllStringSubmatch(readme, -1) {
		port, _ := strconv.Atoi(m[1])
		found := false
		for _, s := range services {
			for _, pp := range s.ports {
				found = found || pp.published == port
			}
		}
		if !found {
			p.addf("examples/compose/README.md: localhost:%d is not published by any service", port)
		}
	}
	p.report(t)
}
