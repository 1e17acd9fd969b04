package consultest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// BinaryEnv names the environment variable that points at a Consul binary,
// bypassing tools/consul/install.sh.
const BinaryEnv = "SHARELIMIT_CONSUL_BIN"

const (
	modulePath = "github.com/sharelimit/sharelimit"
	installer  = "tools/consul/install.sh"
)

// Binary returns the path of the Consul agent binary: $SHARELIMIT_CONSUL_BIN
// if set, else whatever tools/consul/install.sh prints (building it on the
// first run, which takes minutes on a cold machine). The answer is computed
// once per process.
func Binary() (string, error) { return binary() }

var binary = sync.OnceValues(func() (string, error) { return findBinary(os.Getenv(BinaryEnv)) })

// findBinary is Binary's work, given the value of $SHARELIMIT_CONSUL_BIN.
func findBinary(fromEnv string) (string, error) {
	if p := fromEnv; p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s: %w", BinaryEnv, err)
		}
		return p, nil
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	script := filepath.Join(root, installer)
	var stdout, stderr bytes.Buffer
	cmd := exec.Command("bash", script)
	cmd.Stdout = &stdout
	// A cold build takes minutes; let its progress show.
	cmd.Stderr = io.MultiWriter(&stderr, os.Stderr)
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("build consul with %s (or set $%s): %w\n%s", script, BinaryEnv, err, lastBytes(stderr.String(), 4096))
	}
	lines := strings.Fields(stdout.String())
	if len(lines) == 0 {
		return "", fmt.Errorf("%s printed no binary path", script)
	}
	path := lines[len(lines)-1]
	if _, err := os.Stat(path); err != nil {
		return "", fmt.Errorf("%s printed %q: %w", script, path, err)
	}
	return path, nil
}

// moduleRoot walks up from the working directory to the directory whose
// go.mod declares sharelimit's main module (tools/consul has a go.mod of its
// own, which is skipped).
func moduleRoot() (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for dir := wd; ; {
		if f, err := os.Open(filepath.Join(dir, "go.mod")); err == nil {
			name := moduleName(f)
			f.Close()
			if name == modulePath {
				return dir, nil
			}
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("no go.mod declaring module %s above %s", modulePath, wd)
		}
		dir = parent
	}
}

func moduleName(r io.Reader) string {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && f[0] == "module" {
			return strings.Trim(f[1], `"`+"`")
		}
	}
	return ""
}
