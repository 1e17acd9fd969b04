//go:build !linux

package e2e

import "os/exec"

// configureProcess does nothing here: only Linux can tie a child's life to
// its parent's. The tests' cleanups still kill every daemon.
func configureProcess(*exec.Cmd) {}
