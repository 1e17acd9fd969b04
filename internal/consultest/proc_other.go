//go:build !linux

package consultest

import "os/exec"

// configureProcess does nothing here: only Linux can tie the agent's life to
// the test binary's.
func configureProcess(*exec.Cmd) {}
