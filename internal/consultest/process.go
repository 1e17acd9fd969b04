package consultest

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

const readyTimeout = 30 * time.Second

type process struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{} // closed when the process has exited
	err  error         // cmd.Wait's result, set before done closes
}

// start runs one agent process on a.ports and waits until it is ready.
func (a *Agent) start() error {
	dir, err := os.MkdirTemp(a.base, "agent-")
	if err != nil {
		return err
	}
	logPath := filepath.Join(dir, "agent.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return err
	}
	defer logFile.Close() // the child has its own descriptor

	args := []string{
		"agent", "-dev",
		"-bind", "127.0.0.1", "-client", "127.0.0.1",
		"-node", a.node,
		"-data-dir", filepath.Join(dir, "data"),
		"-http-port", strconv.Itoa(a.ports[0]),
		"-serf-lan-port", strconv.Itoa(a.ports[1]),
		"-server-port", strconv.Itoa(a.ports[2]),
		// Unused listeners are disabled; without -grpc-tls-port -1 the agent
		// silently takes 8503 and parallel agents collide.
		"-serf-wan-port", "-1", "-dns-port", a.dnsPort(),
		"-grpc-port", "-1", "-grpc-tls-port", "-1",
		"-log-level", "warn",
	}
	cmd := exec.Command(a.bin, append(args, a.args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.Env = agentEnv()
	configureProcess(cmd)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("run %s: %w", a.bin, err)
	}
	p := &process{cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	if err := a.waitReady(p); err != nil {
		_ = cmd.Process.Kill()
		<-p.done
		return err
	}
	a.mu.Lock()
	a.proc = p
	a.mu.Unlock()
	return nil
}

// dnsPort is the -dns-port argument: the DNS port with WithDNS, else -1
// (off).
func (a *Agent) dnsPort() string {
	if len(a.ports) < 4 {
		return "-1"
	}
	return strconv.Itoa(a.ports[3])
}

// waitReady polls until the agent on a.ports is ours and knows a leader.
func (a *Agent) waitReady(p *process) error {
	hc := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	base := "http://" + a.Addr()
	deadline := time.Now().Add(readyTimeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-p.done:
			return fmt.Errorf("consul agent exited during start-up (%v); its log:\n%s", p.err, tail(p.log))
		case <-time.After(25 * time.Millisecond):
		}
		var self struct{ Config struct{ NodeName string } }
		if last = getJSON(hc, base+"/v1/agent/self", &self); last != nil {
			continue
		}
		if self.Config.NodeName != a.node {
			// Another process answers on our port.
			return fmt.Errorf("port %d answers as node %q, not %q", a.ports[0], self.Config.NodeName, a.node)
		}
		var leader string
		if last = getJSON(hc, base+"/v1/status/leader", &leader); last != nil {
			continue
		}
		if leader != "" {
			return nil
		}
		last = errors.New("no leader yet")
	}
	return fmt.Errorf("consul agent not ready within %s (last: %v); its log:\n%s", readyTimeout, last, tail(p.log))
}

func getJSON(hc *http.Client, url string, out any) error {
	resp, err := hc.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s: %s", url, resp.Status, bytes.TrimSpace(body))
	}
	return json.Unmarshal(body, out)
}

// agentEnv is the test's environment without CONSUL_* variables, so a
// developer's own Consul settings never reach the test agent.
func agentEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CONSUL_") {
			env = append(env, kv)
		}
	}
	return env
}

// tail returns the end of the log at path.
func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	return lastBytes(string(b), 8192)
}

func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "…" + s[len(s)-n:]
}
