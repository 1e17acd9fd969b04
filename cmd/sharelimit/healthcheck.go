package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/sharelimit/sharelimit/config"
)

// healthcheck asks a running daemon's /healthcheck and exits 0 on 200, 1
// otherwise. It exists for exec probes: the container image has no shell and no
// curl, and the admin listener is loopback-only, so a probe must run inside the
// pod's network namespace. It reads --http-addr like serve does, including
// SHARELIMIT_HTTP_ADDR and upstream's HOST and PORT, so it finds the daemon
// without extra configuration.
func healthcheck(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("healthcheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("http-addr", "", "the daemon's admin address (default: $"+config.EnvName("http-addr")+", else upstream's $HOST:$PORT, else 127.0.0.1:8080)")
	timeout := fs.Duration("timeout", 2*time.Second, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *addr == "" {
		// The address serve would listen on: SHARELIMIT_HTTP_ADDR, else
		// upstream's HOST and PORT, else the default. A host that listens on
		// every address is reached on loopback.
		*addr = config.Defaults().HTTPAddr
		if cfg, err := config.Parse("healthcheck", nil, getenv, io.Discard); err == nil {
			*addr = cfg.HTTPAddr
		}
		if host, port, err := net.SplitHostPort(*addr); err == nil && (host == "" || net.ParseIP(host) != nil && net.ParseIP(host).IsUnspecified()) {
			*addr = net.JoinHostPort("127.0.0.1", port)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+*addr+"/healthcheck", nil)
	if err != nil {
		fmt.Fprintln(stderr, "healthcheck:", err)
		return 2
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Fprintln(stderr, "healthcheck:", err)
		return 1
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(stderr, "healthcheck: %s: %s\n", resp.Status, body)
		return 1
	}
	fmt.Fprintf(stdout, "%s\n", body)
	return 0
}
