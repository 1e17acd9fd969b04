// Package examples holds the deployment files (descriptor YAML, Envoy
// bootstraps for RLS and for RLQS, a compose cluster's files, a systemd
// unit, Kubernetes manifests and a Grafana dashboard), and its tests keep
// them, the Dockerfile, .dockerignore and docker-compose.yml true to the
// daemon they deploy. Docker, Kubernetes, systemd and Grafana cannot run
// here, so each file is checked against what can: the real binary's flag
// parsing, validation, check and explain, Envoy's own protobuf schema and
// validation rules (for every piece of Envoy configuration in the
// repository), systemd-analyze, and the /metrics of a running daemon.
//
// Why a package of its own: these files are documentation that operators
// copy, and documentation drifts silently; as a package they are tested
// with the code on every run. The package holds no code; everything is in
// its tests.
//
// Every check collects problems instead of failing on the spot, so that
// breakage_test.go can feed it a broken copy and prove it would fail. A
// check must never skip: a tool it needs that is missing (systemd-analyze)
// fails it.
package examples
