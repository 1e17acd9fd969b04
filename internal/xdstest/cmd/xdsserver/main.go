// Command xdsserver is a test-only xDS management server: go-control-plane's
// ADS server and snapshot cache, serving RateLimitConfig resources to one node,
// with an HTTP control endpoint to change the snapshot and read what the
// clients answered. It serves nothing until the first PUT.
//
//	xdsserver --addr 127.0.0.1:18000 --node-id default --control-addr 127.0.0.1:18001
//
// Control endpoint (see xdstest.Server.Handler):
//
//	curl -X PUT --data-binary @configs.yaml 'http://127.0.0.1:18001/snapshot?version=1'
//	curl http://127.0.0.1:18001/nacks
//
// where configs.yaml is a list of RateLimitConfig in protojson's mapping,
// written as YAML or JSON (see xdstest.ParseConfigs). Once both listeners are
// open it prints "xds ADDR" and "control ADDR" on stdout, so port 0 may be
// asked for. It stops on SIGINT or SIGTERM.
//
// Why a command of its own: e2e and source/xds's process tests run the
// management server as a separate process, so that the source's connection
// to it crosses a real socket and the server can be killed and started
// again. It holds no logic beyond flags and signals (the server is package
// internal/xdstest's), and it must never be shipped: neither the image nor
// make build builds it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/sharelimit/sharelimit/internal/xdstest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "xdsserver:", err)
		os.Exit(1)
	}
}

func run() error {
	addr := flag.String("addr", "127.0.0.1:18000", "address of the xDS (ADS) gRPC listener")
	nodeID := flag.String("node-id", "default", "node id the snapshots are served to")
	controlAddr := flag.String("control-addr", "127.0.0.1:18001", "address of the HTTP control endpoint")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	srv, err := xdstest.Start(*addr, *nodeID)
	if err != nil {
		return err
	}
	defer srv.Stop()
	lis, err := net.Listen("tcp", *controlAddr)
	if err != nil {
		return fmt.Errorf("listen control: %w", err)
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(lis) }()
	fmt.Printf("xds %s\ncontrol %s\n", srv.Addr(), lis.Addr())

	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("serve control: %w", err)
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err = hs.Shutdown(sctx)
	if serr := <-served; !errors.Is(serr, http.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}
