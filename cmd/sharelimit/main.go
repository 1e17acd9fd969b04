// Command sharelimit is a node-local replacement for Envoy's external rate-limit
// service. It reads upstream's descriptor YAML, divides each global limit among
// the replicas that enforce it, and answers Envoy's ShouldRateLimit from memory.
//
//	sharelimit [serve] [flags]     run the daemon (the default command)
//	sharelimit check [--replicas N] [--merge-domain-config] [--config-all-files] PATH...
//	                               validate descriptor YAML
//	sharelimit explain ...         show how a request would be matched and limited
//	sharelimit bench [flags]       the load generator
//	sharelimit simulate [flags]    equal against demand shares, in process
//	sharelimit healthcheck         probe a running daemon's /healthcheck
//	sharelimit version
//
// main only parses the command line, builds one logger and hands the
// settings to package daemon; each part lives in its own package, so that
// every part can be tested without the binary. check and explain read rules
// through package source, bench is package loadgen, and simulate is package
// simulate.
//
// It must hold no logic of its own beyond choosing a subcommand and
// reporting its errors, and it never starts a goroutine itself except the
// one that hears a second signal during the stop (signals.go), which it
// ends before it returns.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"syscall"

	"github.com/sharelimit/sharelimit/loadgen"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run runs the command argv names; argv[0] is the program's own name.
//
// Upstream's images run /bin/ratelimit, and its compose files and manifests
// name it as the command. So the binary run under that name (a link or a
// copy), or given that path or the bare name as its first argument
// (compose's command: under an image whose entrypoint is sharelimit), serves
// in upstream's mode; see config.Config.UpstreamBy.
func run(ctx context.Context, argv []string, stdout, stderr io.Writer) int {
	cmd := "serve"
	asUpstream := len(argv) > 0 && isUpstreamCommand(argv[0])
	var args []string
	if len(argv) > 1 {
		args = argv[1:]
	}
	if len(args) > 0 && isUpstreamCommand(args[0]) {
		asUpstream, args = true, args[1:]
	}
	switch {
	case len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "-help"):
		cmd = "help"
	case len(args) > 0 && len(args[0]) > 0 && args[0][0] != '-':
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return serve(ctx, args, os.Environ(), asUpstream, stderr)
	case "check":
		return check(args, stdout, stderr)
	case "explain":
		return explain(args, stdout, stderr)
	case "healthcheck":
		return healthcheck(ctx, args, os.Getenv, stdout, stderr)
	case "bench":
		return loadgen.Main(ctx, args, stdout, stderr)
	case "simulate":
		return simulateCmd(args, stdout, stderr)
	case "version":
		fmt.Fprintf(stdout, "sharelimit %s %s %s/%s\n", version, runtime.Version(), runtime.GOOS, runtime.GOARCH)
		return 0
	case "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "sharelimit: unknown command %q\n%s", cmd, usage)
	return 2
}

// isUpstreamCommand reports whether name is upstream's command: a path or
// name whose last element is "ratelimit".
func isUpstreamCommand(name string) bool { return filepath.Base(name) == "ratelimit" }

const usage = `usage:
  sharelimit [serve] [flags]                 run the daemon (see sharelimit serve -h)
  sharelimit check [--replicas N] [--merge-domain-config] [--config-all-files] PATH...
                                             validate descriptor YAML files or directories (with
                                             --config-all-files, every file under a directory, as
                                             the daemon reads upstream's RUNTIME_* directory)
  sharelimit explain --config-dir DIR --domain D [--replicas N | --weight W] key=value...
                                             show which rule a request matches and its share
  sharelimit bench [flags]                   Envoy-shaped load generator (see sharelimit bench -h)
  sharelimit simulate [--replicas K] [--shape hot] [--svg out.svg]
                                             K replicas in process: equal against demand shares
  sharelimit healthcheck [--http-addr ADDR]  exit 0 if the daemon's /healthcheck answers 200 (for
                                             container probes: the image has no shell or curl)
  sharelimit version

Run as /bin/ratelimit, upstream's command (or given it as the first argument),
it serves in upstream's mode: see the README's migration checklist.
`
