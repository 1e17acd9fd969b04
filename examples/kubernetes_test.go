package examples_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"gopkg.in/yaml.v3"
)

// The Kubernetes objects, as far as the examples use them. They are decoded
// strictly: a field these types do not know fails the test, which catches a
// misspelt field the API server would reject (or, worse, silently drop).
type (
	k8sMeta struct {
		Name        string            `yaml:"name"`
		Namespace   string            `yaml:"namespace"`
		Labels      map[string]string `yaml:"labels"`
		Annotations map[string]string `yaml:"annotations"`
	}
	k8sConfigMap struct {
		APIVersion string            `yaml:"apiVersion"`
		Kind       string            `yaml:"kind"`
		Metadata   k8sMeta           `yaml:"metadata"`
		Data       map[string]string `yaml:"data"`
	}
	k8sDaemonSet struct {
		APIVersion string  `yaml:"apiVersion"`
		Kind       string  `yaml:"kind"`
		Metadata   k8sMeta `yaml:"metadata"`
		Spec       struct {
			Selector struct {
				MatchLabels map[string]string `yaml:"matchLabels"`
			} `yaml:"selector"`
			UpdateStrategy struct {
				Type          string `yaml:"type"`
				RollingUpdate struct {
					MaxUnavailable any `yaml:"maxUnavailable"`
					MaxSurge       any `yaml:"maxSurge"`
				} `yaml:"rollingUpdate"`
			} `yaml:"updateStrategy"`
			Template struct {
				Metadata k8sMeta `yaml:"metadata"`
				Spec     k8sPod  `yaml:"spec"`
			} `yaml:"template"`
		} `yaml:"spec"`
	}
	k8sPod struct {
		TerminationGracePeriodSeconds *int64            `yaml:"terminationGracePeriodSeconds"`
		AutomountServiceAccountToken  *bool             `yaml:"automountServiceAccountToken"`
		ServiceAccountName            string            `yaml:"serviceAccountName"`
		PriorityClassName             string            `yaml:"priorityClassName"`
		NodeSelector                  map[string]string `yaml:"nodeSelector"`
		Tolerations                   []map[string]any  `yaml:"tolerations"`
		SecurityContext               struct {
			RunAsNonRoot   *bool `yaml:"runAsNonRoot"`
			SeccompProfile struct {
				Type string `yaml:"type"`
			} `yaml:"seccompProfile"`
		} `yaml:"securityContext"`
		Containers []k8sContainer `yaml:"containers"`
		Volumes    []struct {
			Name      string `yaml:"name"`
			ConfigMap *struct {
				Name string `yaml:"name"`
			} `yaml:"configMap"`
			EmptyDir *struct {
				Medium    string `yaml:"medium"`
				SizeLimit string `yaml:"sizeLimit"`
			} `yaml:"emptyDir"`
			HostPath *struct {
				Path string `yaml:"path"`
				Type string `yaml:"type"`
			} `yaml:"hostPath"`
		} `yaml:"volumes"`
	}
	k8sContainer struct {
		Name            string   `yaml:"name"`
		Image           string   `yaml:"image"`
		ImagePullPolicy string   `yaml:"imagePullPolicy"`
		Command         []string `yaml:"command"`
		Args            []string `yaml:"args"`
		Env             []struct {
			Name      string `yaml:"name"`
			Value     string `yaml:"value"`
			ValueFrom *struct {
				FieldRef *struct {
					FieldPath string `yaml:"fieldPath"`
				} `yaml:"fieldRef"`
				ResourceFieldRef *struct {
					Resource string `yaml:"resource"`
					Divisor  string `yaml:"divisor"`
				} `yaml:"resourceFieldRef"`
			} `yaml:"valueFrom"`
		} `yaml:"env"`
		Ports []struct {
			Name          string `yaml:"name"`
			ContainerPort int    `yaml:"containerPort"`
			Protocol      string `yaml:"protocol"`
		} `yaml:"ports"`
		ReadinessProbe *k8sProbe `yaml:"readinessProbe"`
		LivenessProbe  *k8sProbe `yaml:"livenessProbe"`
		StartupProbe   *k8sProbe `yaml:"startupProbe"`
		Lifecycle      struct {
			PreStop *struct {
				Exec struct {
					Command []string `yaml:"command"`
				} `yaml:"exec"`
			} `yaml:"preStop"`
		} `yaml:"lifecycle"`
		Resources struct {
			Requests map[string]string `yaml:"requests"`
			Limits   map[string]string `yaml:"limits"`
		} `yaml:"resources"`
		SecurityContext struct {
			RunAsNonRoot             *bool  `yaml:"runAsNonRoot"`
			RunAsUser                *int64 `yaml:"runAsUser"`
			RunAsGroup               *int64 `yaml:"runAsGroup"`
			ReadOnlyRootFilesystem   *bool  `yaml:"readOnlyRootFilesystem"`
			AllowPrivilegeEscalation *bool  `yaml:"allowPrivilegeEscalation"`
			Capabilities             struct {
				Drop []string `yaml:"drop"`
			} `yaml:"capabilities"`
		} `yaml:"securityContext"`
		VolumeMounts []struct {
			Name      string `yaml:"name"`
			MountPath string `yaml:"mountPath"`
			ReadOnly  bool   `yaml:"readOnly"`
			SubPath   string `yaml:"subPath"`
		} `yaml:"volumeMounts"`
	}
	k8sProbe struct {
		HTTPGet *struct {
			Path string `yaml:"path"`
			Port any    `yaml:"port"`
		} `yaml:"httpGet"`
		Exec *struct {
			Command []string `yaml:"command"`
		} `yaml:"exec"`
		GRPC *struct {
			Port int `yaml:"port"`
		} `yaml:"grpc"`
		TCPSocket *struct {
			Port any `yaml:"port"`
		} `yaml:"tcpSocket"`
		InitialDelaySeconds int `yaml:"initialDelaySeconds"`
		PeriodSeconds       int `yaml:"periodSeconds"`
		TimeoutSeconds      int `yaml:"timeoutSeconds"`
		FailureThreshold    int `yaml:"failureThreshold"`
	}
)

// k8sManifests is every object in a directory of manifests.
type k8sManifests struct {
	configMaps map[string]*k8sConfigMap
	daemonSets []*k8sDaemonSet
	files      map[string]bool // the .yaml files besides kustomization.yaml
	resources  []string        // kustomization.yaml's resources
}

// strictDecode decodes one YAML document, refusing unknown fields.
func strictDecode(doc *yaml.Node, v any) error {
	b, err := yaml.Marshal(doc)
	if err != nil {
		return err
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	return dec.Decode(v)
}

// parseManifests reads files (name -> content) of multi-document YAML.
func parseManifests(p *problems, files map[string][]byte) *k8sManifests {
	m := &k8sManifests{configMaps: map[string]*k8sConfigMap{}, files: map[string]bool{}}
	for _, name := range sortedKeys(files) {
		where := "examples/kubernetes/" + name
		if name == "kustomization.yaml" {
			var k struct {
				APIVersion string   `yaml:"apiVersion"`
				Kind       string   `yaml:"kind"`
				Resources  []string `yaml:"resources"`
			}
			dec := yaml.NewDecoder(bytes.NewReader(files[name]))
			dec.KnownFields(true)
			if err := dec.Decode(&k); err != nil {
				p.addf("%s: %v", where, err)
			}
			m.resources = k.Resources
			continue
		}
		m.files[name] = true
		dec := yaml.NewDecoder(bytes.NewReader(files[name]))
		for {
			var doc yaml.Node
			err := dec.Decode(&doc)
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				p.addf("%s: %v", where, err)
				break
			}
			var head struct {
				Kind string `yaml:"kind"`
			}
			if err := doc.Decode(&head); err != nil {
				p.addf("%s: %v", where, err)
				continue
			}
			switch head.Kind {
			case "ConfigMap":
				var cm k8sConfigMap
				if err := strictDecode(&doc, &cm); err != nil {
					p.addf("%s: ConfigMap: %v", where, err)
					continue
				}
				m.configMaps[cm.Metadata.Name] = &cm
			case "DaemonSet":
				var ds k8sDaemonSet
				if err := strictDecode(&doc, &ds); err != nil {
					p.addf("%s: DaemonSet: %v", where, err)
					continue
				}
				if ds.APIVersion != "apps/v1" {
					p.addf("%s: DaemonSet %s: apiVersion %q, want apps/v1", where, ds.Metadata.Name, ds.APIVersion)
				}
				m.daemonSets = append(m.daemonSets, &ds)
			default:
				p.addf("%s: kind %q: this guard does not check it; teach it", where, head.Kind)
			}
		}
	}
	return m
}

// resolveEnv gives a container's environment the values it would have on a
// node: downward-API fields get sample values, $(VAR) references expand.
// helpers names the variables that only feed others.
func resolveEnv(p *problems, where string, c *k8sContainer) (env map[string]string, helpers map[string]bool) {
	sample := map[string]string{
		"spec.nodeName": "node-a", "status.hostIP": "10.0.0.7", "status.podIP": "10.1.2.3",
		"metadata.name": "edge-gateway-x7k2p", "metadata.namespace": "default",
	}
	env, helpers = map[string]string{}, map[string]bool{}
	ref := regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			env[e.Name] = ref.ReplaceAllStringFunc(e.Value, func(s string) string {
				name := s[2 : len(s)-1]
				v, ok := env[name]
				if !ok {
					p.addf("%s: %s refers to $(%s), which is not defined above it", where, e.Name, name)
				}
				helpers[name] = true
				return v
			})
		case e.ValueFrom.FieldRef != nil:
			v, ok := sample[e.ValueFrom.FieldRef.FieldPath]
			if !ok {
				p.addf("%s: %s: fieldRef %s: not a field this guard knows", where, e.Name, e.ValueFrom.FieldRef.FieldPath)
			}
			env[e.Name] = v
		case e.ValueFrom.ResourceFieldRef != nil:
			if _, ok := c.Resources.Limits[strings.TrimPrefix(e.ValueFrom.ResourceFieldRef.Resource, "limits.")]; !ok {
				p.addf("%s: %s: resourceFieldRef %s, but the container sets no such limit", where, e.Name, e.ValueFrom.ResourceFieldRef.Resource)
			}
			env[e.Name] = "268435456"
		}
	}
	return env, helpers
}

// checkKubernetes checks the manifests: the descriptors ConfigMap compiles to
// the same rules as examples/config, the sharelimit container's flags and
// environment are real, it mounts that ConfigMap as its --config-dir, Envoy in
// the same pod reaches it, the readiness probe can reach /healthcheck, and every
// container is locked down.
func checkKubernetes(p *problems, files map[string][]byte) {
	m := parseManifests(p, files)
	for _, r := range m.resources {
		if !m.files[r] {
			p.addf("examples/kubernetes/kustomization.yaml: resource %s does not exist", r)
		}
	}
	for f := range m.files {
		found := false
		for _, r := range m.resources {
			found = found || r == f
		}
		if !found {
			p.addf("examples/kubernetes/kustomization.yaml: %s is not among its resources", f)
		}
	}
	if len(m.daemonSets) != 1 {
		p.addf("examples/kubernetes: %d DaemonSets, want 1", len(m.daemonSets))
		return
	}
	ds := m.daemonSets[0]
	pod := &ds.Spec.Template.Spec
	where := "examples/kubernetes: DaemonSet " + ds.Metadata.Name
	for k, v := range ds.Spec.Selector.MatchLabels {
		if ds.Spec.Template.Metadata.Labels[k] != v {
			p.addf("%s: the selector %s=%s does not match the pod template's labels", where, k, v)
		}
	}

	// Volumes backed by ConfigMaps: name -> the ConfigMap.
	cmVolumes := map[string]*k8sConfigMap{}
	for _, v := range pod.Volumes {
		if v.ConfigMap != nil {
			cm := m.configMaps[v.ConfigMap.Name]
			if cm == nil {
				p.addf("%s: volume %s: ConfigMap %q is not in examples/kubernetes", where, v.Name, v.ConfigMap.Name)
			}
			cmVolumes[v.Name] = cm
		}
	}
	// Writes a ConfigMap's files to a directory of their own.
	materialize := func(cm *k8sConfigMap) string {
		dir, err := os.MkdirTemp("", "sharelimit-k8s-")
		if err != nil {
			p.addf("%v", err)
			return ""
		}
		for name, data := range cm.Data {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
				p.addf("%v", err)
			}
		}
		return dir
	}

	var sidecar, envoy *k8sContainer
	ports := map[string]int{} // named container ports in the pod
	for i := range pod.Containers {
		c := &pod.Containers[i]
		checkContainerSecurity(p, where, pod, c)
		for _, port := range c.Ports {
			if port.Name != "" {
				ports[port.Name] = port.ContainerPort
			}
		}
		switch {
		case strings.Contains(c.Image, "sharelimit"):
			sidecar = c
		case strings.HasPrefix(c.Image, "envoyproxy/envoy:"):
			envoy = c
		}
	}
	if sidecar == nil || envoy == nil {
		p.addf("%s: want an Envoy container and a sharelimit container in the pod", where)
		return
	}

	// The sharelimit container.
	swhere := where + ": container " + sidecar.Name
	env, helpers := resolveEnv(p, swhere, sidecar)
	mounts := map[string]string{}
	var cleanup []string
	defer func() {
		for _, d := range cleanup {
			os.RemoveAll(d)
		}
	}()
	var descriptors *k8sConfigMap
	for _, vm := range sidecar.VolumeMounts {
		cm := cmVolumes[vm.Name]
		if cm == nil {
			continue
		}
		if vm.SubPath != "" {
			p.addf("%s: %s mounted with subPath: the kubelet never updates subPath mounts, so edits would not reload", swhere, vm.MountPath)
		}
		if !vm.ReadOnly {
			p.addf("%s: mount %s readOnly", swhere, vm.MountPath)
		}
		if dir := materialize(cm); dir != "" {
			cleanup = append(cleanup, dir)
			mounts[vm.MountPath] = dir
			if descriptors == nil || vm.MountPath == "/etc/sharelimit/config" {
				descriptors = cm
			}
		}
	}
	// A writable emptyDir (kept across container restarts) or hostPath
	// (kept across pod replacements too) holds the state file.
	states := map[string]bool{}
	for _, vm := range sidecar.VolumeMounts {
		for _, v := range pod.Volumes {
			if v.Name == vm.Name && !vm.ReadOnly && (v.EmptyDir != nil && v.EmptyDir.Medium != "Memory" || v.HostPath != nil) {
				states[vm.MountPath] = true
			}
		}
	}
	args := append(append([]string{}, sidecar.Command...), sidecar.Args...)
	cfg := checkDaemon(p, daemon{where: swhere, args: args, env: env, mounts: mounts, helperEnv: helpers, stateDirs: states})
	if cfg == nil {
		return
	}
	dir, ok := mounts[cfg.ConfigDir]
	if !ok {
		return // checkDaemon said so
	}
	checkDescriptors(p, swhere, dir)
	got, err1 := compiledRules(dir)
	want, err2 := compiledRules(filepath.Join(repo, "examples", "config"))
	switch {
	case err1 != nil || err2 != nil:
		p.addf("%s: %v %v", swhere, err1, err2)
	case strings.ReplaceAll(got, dir, "DIR") != strings.ReplaceAll(want, filepath.Join(repo, "examples", "config"), "DIR"):
		p.addf("%s: the descriptors ConfigMap %s no longer compiles to the rules of examples/config; copy the files again.\nConfigMap:\n%s\nexamples/config:\n%s", swhere, descriptors.Metadata.Name, got, want)
	}
	if cfg.ConsulService != "" {
		if env["CONSUL_HTTP_ADDR"] != "10.0.0.7:8500" {
			p.addf("%s: CONSUL_HTTP_ADDR resolves to %q; want the node's agent, $(HOST_IP):8500 from status.hostIP", swhere, env["CONSUL_HTTP_ADDR"])
		}
		if cfg.Node != "node-a" {
			p.addf("%s: --node resolves to %q; want spec.nodeName, the name the node's agent registers under", swhere, cfg.Node)
		}
	}
	if g := pod.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second <= stopBudget(cfg) {
		p.addf("%s: terminationGracePeriodSeconds must outlast --drain %s + --shutdown-timeout %s", where, cfg.Drain, cfg.ShutdownTimeout)
	}

	// Envoy, in the same pod, must reach the sidecar.
	ewhere := where + ": container " + envoy.Name
	eargs := append(append([]string{}, envoy.Command...), envoy.Args...)
	bootstrap, ok := flagValue(eargs, "c")
	if !ok {
		p.addf("%s: no -c bootstrap", ewhere)
		return
	}
	var ec *envoyConfig
	for _, vm := range envoy.VolumeMounts {
		if cm := cmVolumes[vm.Name]; cm != nil && path.Dir(bootstrap) == vm.MountPath && vm.SubPath == "" {
			data, ok := cm.Data[path.Base(bootstrap)]
			if !ok {
				p.addf("%s: ConfigMap %s has no %s", ewhere, cm.Metadata.Name, path.Base(bootstrap))
				return
			}
			ec = checkEnvoy(p, ewhere+": "+bootstrap, []byte(data), envoyWant{grpcAddr: cfg.GRPCAddr, configDir: dir, replicas: cfg.Replicas})
		}
	}
	if ec == nil {
		p.addf("%s: %s is not in a mounted ConfigMap", ewhere, bootstrap)
		return
	}
	checkReadiness(p, swhere, sidecar, ports, ec, cfg.HTTPAddr)
	checkScrape(p, swhere, ds, sidecar, cfg)
	if cfg.ConsulService != "" {
		checkRegistration(p, where, pod, sidecar, env, cfg.ConsulService)
	}
	if envoy.Lifecycle.PreStop == nil {
		p.addf("%s: no preStop: Envoy would stop accepting before endpoints are updated", ewhere)
	}
}

// checkReadiness follows the readiness probe: the kubelet requests the pod IP,
// so the port must be a listener that is not on loopback, and the request must
// end at sharelimit's /healthcheck.
func checkReadiness(p *problems, where string, c *k8sContainer, ports map[string]int, ec *envoyConfig, adminAddr string) {
	probe := c.ReadinessProbe
	if probe == nil || probe.HTTPGet == nil {
		p.addf("%s: want an httpGet readinessProbe that ends at /healthcheck", where)
		return
	}
	port := 0
	switch v := probe.HTTPGet.Port.(type) {
	case int:
		port = v
	case string:
		port = ports[v]
	}
	if port == 0 {
		p.addf("%s: readinessProbe port %v is not a container port of the pod", where, probe.HTTPGet.Port)
		return
	}
	if _, adminPort, _ := net.SplitHostPort(adminAddr); strconv.Itoa(port) == adminPort {
		if isLoopbackAddr(adminAddr) {
			p.addf("%s: readinessProbe on %d: sharelimit's admin listener is on loopback (%s), and the kubelet probes the pod IP", where, port, adminAddr)
		}
		return
	}
	l := ec.listener(port)
	if l == nil || l.hcm == nil || isLoopbackAddr(l.addr) {
		p.addf("%s: readinessProbe port %d is no Envoy HTTP listener the kubelet can reach", where, port)
		return
	}
	r := l.route(probe.HTTPGet.Path)
	if r == nil || r.GetRoute() == nil {
		p.addf("%s: readinessProbe %s on :%d matches no route to a cluster", where, probe.HTTPGet.Path, port)
		return
	}
	eps := ec.endpoints(r.GetRoute().GetCluster())
	if len(eps) != 1 || eps[0] != adminAddr || probe.HTTPGet.Path != "/healthcheck" || r.GetRoute().GetPrefixRewrite() != "" {
		p.addf("%s: readinessProbe %s on :%d goes to %v; want /healthcheck on sharelimit's --http-addr %s", where, probe.HTTPGet.Path, port, eps, adminAddr)
	}
	// The listener is reachable from the pod network: it must not pass anything
	// but /healthcheck to the admin listener (/json spends tokens).
	for _, vh := range l.hcm.GetRouteConfig().GetVirtualHosts() {
		for _, rt := range vh.GetRoutes() {
			if c := rt.GetRoute().GetCluster(); c != "" && ec.endpoints(c) != nil && ec.endpoints(c)[0] == adminAddr && rt.GetMatch().GetPath() != "/healthcheck" {
				p.addf("%s: listener %s passes %v to sharelimit's admin listener; only the exact path /healthcheck may", where, l.name, rt.GetMatch())
			}
		}
	}
}

// checkContainerSecurity wants every container non-root, read-only, without
// privilege escalation or capabilities, and with resources.
func checkContainerSecurity(p *problems, where string, pod *k8sPod, c *k8sContainer) {
	where = fmt.Sprintf("%s: container %s", where, c.Name)
	sc := c.SecurityContext
	nonRoot := (pod.SecurityContext.RunAsNonRoot != nil && *pod.SecurityContext.RunAsNonRoot) || (sc.RunAsNonRoot != nil && *sc.RunAsNonRoot)
	if !nonRoot || (sc.RunAsUser != nil && *sc.RunAsUser == 0) {
		p.addf("%s: want runAsNonRoot", where)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		p.addf("%s: want readOnlyRootFilesystem: true", where)
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		p.addf("%s: want allowPrivilegeEscalation: false", where)
	}
	if len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" {
		p.addf("%s: want capabilities.drop: [ALL]", where)
	}
	if c.Resources.Requests["cpu"] == "" || c.Resources.Requests["memory"] == "" || c.Resources.Limits["memory"] == "" {
		p.addf("%s: want cpu and memory requests and a memory limit", where)
	}
	if !strings.Contains(c.Image, ":") || strings.HasSuffix(c.Image, ":latest") {
		p.addf("%s: image %q: pin a tag", where, c.Image)
	}
}

func kubernetesFiles(t *testing.T) map[string][]byte {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(repo, "examples", "kubernetes"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{}
	for _, e := range entries {
		if strings.HasSuffix(e.Name(), ".yaml") {
			files[e.Name()] = readFile(t, "examples/kubernetes/"+e.Name())
		}
	}
	if len(files) < 3 {
		t.Fatalf("examples/kubernetes has %d manifests", len(files))
	}
	return files
}

func TestKubernetes(t *testing.T) {
	t.Parallel()
	var p problems
	checkKubernetes(&p, kubernetesFiles(t))
	p.report(t)
}

// checkRegistration checks that something registers each gateway in Consul
// under the service sharelimit counts, through the same agent, with a check
// that follows the pod's readiness.
func checkRegistration(p *problems, where string, pod *k8sPod, sidecar *k8sContainer, sidecarEnv map[string]string, service string) {
	var reg *k8sContainer
	for i := range pod.Containers {
		if strings.HasPrefix(pod.Containers[i].Image, "hashicorp/consul:") {
			reg = &pod.Containers[i]
		}
	}
	if reg == nil {
		p.addf("%s: nothing registers the gateways as %q in Consul, so sharelimit would count none", where, service)
		return
	}
	where += ": container " + reg.Name
	env, _ := resolveEnv(p, where, reg)
	if env["CONSUL_HTTP_ADDR"] != sidecarEnv["CONSUL_HTTP_ADDR"] {
		p.addf("%s: registers through %q, but sharelimit asks %q", where, env["CONSUL_HTTP_ADDR"], sidecarEnv["CONSUL_HTTP_ADDR"])
	}
	script := strings.Join(append(append([]string{}, reg.Command...), reg.Args...), "\n")
	if m := regexp.MustCompile(`"name":\s*"([^"]*)"`).FindStringSubmatch(script); m == nil || m[1] != service {
		p.addf("%s: the registered service name is not %q, the --consul-service sharelimit counts", where, service)
	}
	probe := sidecar.ReadinessProbe
	m := regexp.MustCompile(`"http":\s*"http://\$\{POD_IP\}:(\d+)(/[^"]*)"`).FindStringSubmatch(script)
	if m == nil || probe == nil || probe.HTTPGet == nil || m[2] != probe.HTTPGet.Path {
		p.addf("%s: the Consul check should request the readiness endpoint on the pod IP, so a draining gateway leaves the count", where)
	}
	if !strings.Contains(script, "services deregister") {
		p.addf("%s: never deregisters: a deleted pod would count until its check fails", where)
	}
}
