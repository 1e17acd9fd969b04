//go:build linux

package interop

import (
	"os/exec"
	"syscall"
)

// configureProcess makes the kernel kill a daemon or client if the test
// binary dies without running its cleanups (a panic, a timeout, SIGKILL).
func configureProcess(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
