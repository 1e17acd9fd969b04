// Package e2e proves sharelimit's promise with real processes: K daemons built
// from cmd/sharelimit, one real Consul agent (internal/consultest) whose health
// catalog lists K nodes' instances of the service "app", and Envoy-shaped gRPC
// load spread over the daemons as a load balancer in front of the nodes would.
// Each daemon runs as its node (--node), on its own loopback ports, watching
// the same config directory. The tests assert that the aggregate admitted rate
// tracks the global limit in a steady state, while the replica count changes,
// while Consul is down, under uneven traffic and across a config reload, and
// that a daemon drains cleanly on SIGTERM; each prints a table of what it
// measured (go test -v).
//
// Every rate is read from the daemons' own accounting (/rlconfig/admitted:
// what each admitted per 100 ms of its clock), not from the client's answers,
// so a load that falls behind on a busy machine changes what is offered,
// never what is measured. The upper bound of a window is always checked,
// allowing for the tokens the load's lateness can have saved; a lower bound
// is checked against what could be admitted given what was offered and when
// (measure_test.go says how, and why the bounds are sound).
//
//	go test -race -count=1 -v ./e2e/
//
// Why a package of its own: the cluster-wide cap is a property of several
// processes, a Consul agent and a clock that none of them controls, so no unit
// test can hold it; these tests are slow, and are kept apart so that every
// other package's tests stay fast. They must never count a bound they could
// not test as met (a window the load reached too late to test a lower bound is
// logged NOT TESTED), and never skip for want of Consul: a missing agent fails
// them.
//
// The package holds no code of its own; everything is in its tests. Set
// SHARELIMIT_E2E_TIMESERIES=path to have the scale-up test write its time
// series as JSON (a relative path is relative to this directory); tools/chart
// renders it:
//
//	SHARELIMIT_E2E_TIMESERIES=/tmp/scale-event.json go test -race -count=1 -run TestScaleUp ./e2e/
//	go run ./tools/chart -in /tmp/scale-event.json -out docs/scale-event.svg
package e2e
