// Package testutil holds the helpers the tests of several packages share:
// waiting for a condition (Eventually, Within), a free loopback address
// (FreeAddr), a command built once per test binary (Build), golden files,
// and a buffer a child process can write to while the test reads it.
//
// It is a package of its own so that each of these is written once, with
// one set of generous deadlines, instead of once per package with its own.
//
// Only tests import it: production code must never depend on it. Its waits
// catch hangs and never measure speed, so none of its deadlines may be short
// enough to fail a healthy run on a loaded machine.
package testutil
