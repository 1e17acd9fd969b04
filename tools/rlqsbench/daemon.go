package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// domain is the rules' domain; cpuValue and accValue the generic_key values
// of the CPU phases' rule and the accuracy phase's rule. cpuValue is the
// load generator's one value at cardinality 1.
const (
	domain   = "rlqsbench"
	cpuValue = "key-0"
	accValue = "skew"
)

// writeRules writes the one rules file both daemons read: limit a second on
// generic_key=key-0, for the CPU phases, and accLimit on generic_key=skew.
// Each burst is the default, one second of its limit.
func writeRules(dir string, limit, accLimit int) error {
	y := fmt.Sprintf(`domain: %s
descriptors:
  - key: generic_key
    value: %s
    rate_limit: {unit: second, requests_per_unit: %d}
  - key: generic_key
    value: %s
    rate_limit: {unit: second, requests_per_unit: %d}
`, domain, cpuValue, limit, accValue, accLimit)
	if err := os.WriteFile(filepath.Join(dir, "rlqsbench.yaml"), []byte(y), 0o644); err != nil {
		return fmt.Errorf("write rules: %w", err)
	}
	return nil
}

// daemon is one sharelimit process this command started.
type daemon struct {
	name       string
	cmd        *exec.Cmd
	grpc, http string
	exited     chan struct{}
	err        error // Wait's, once exited is closed
}

// daemonArgs are the flags every daemon runs with, apart from its addresses.
func daemonArgs(configDir string) []string {
	return []string{"serve", "--config-dir", configDir, "--replicas", "1", "--rlqs",
		"--log-level", "warn", "--drain", "0", "--shutdown-timeout", "2"}
}

// startDaemon starts bin on free loopback ports, its output in logDir, and
// waits until its /healthcheck answers 200.
func startDaemon(ctx context.Context, bin, name, configDir, logDir string) (*daemon, error) {
	g, err := freeAddr()
	if err != nil {
		return nil, err
	}
	h, err := freeAddr()
	if err != nil {
		return nil, err
	}
	log, err := os.Create(filepath.Join(logDir, name+".log"))
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	defer log.Close()
	args := append(daemonArgs(configDir), "--grpc-addr", g, "--http-addr", h)
	d := &daemon{name: name, cmd: exec.Command(bin, args...), grpc: g, http: h, exited: make(chan struct{})}
	d.cmd.Stdout, d.cmd.Stderr = log, log
	if err := d.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		d.err = d.cmd.Wait()
		close(d.exited)
	}()
	if err := d.awaitReady(ctx, 30*time.Second); err != nil {
		d.stop()
		return nil, fmt.Errorf("start %s (log %s): %w", name, log.Name(), err)
	}
	return d, nil
}

func (d *daemon) pid() int { return d.cmd.Process.Pid }

// awaitReady polls /healthcheck until it answers 200, the process exits, or
// limit passes.
func (d *daemon) awaitReady(ctx context.Context, limit time.Duration) error {
	client := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		resp, err := client.Get("http://" + d.http + "/healthcheck")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-d.exited:
			return fmt.Errorf("exited before it was ready: %v", d.err)
		case <-time.After(50 * time.Millisecond):
		}
	}
	return errors.New("not ready within " + limit.String())
}

// stop sends SIGTERM and waits; after 10 s it kills the process.
func (d *daemon) stop() {
	_ = d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-time.After(10 * time.Second):
		_ = d.cmd.Process.Kill()
		<-d.exited
	}
}

// freeAddr is a loopback address with a port the kernel had free.
func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().String(), nil
}
