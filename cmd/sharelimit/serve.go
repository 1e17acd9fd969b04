package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/daemon"
)

func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(strings.ToLower(cfg.LogLevel)))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// serve runs the daemon until ctx ends (SIGTERM or SIGINT), then drains. A
// second signal during the stop makes it stop at once.
// environ is the process's environment, as os.Environ gives it.
func serve(ctx context.Context, args, environ []string, stderr io.Writer) int {
	cfg, err := config.ParseEnviron("serve", args, environ, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "sharelimit:", err)
		return 2
	}
	if err := cfg.Validate(); err != nil {
		fmt.Fprintln(stderr, "sharelimit: invalid settings:")
		fmt.Fprintln(stderr, err)
		return 2
	}
	log := newLogger(cfg, stderr)
	for _, n := range cfg.Notices {
		log.Log(ctx, n.Level, n.Message, "variables", n.Vars)
	}
	d, err := daemon.New(cfg, log, version)
	if errors.Is(err, daemon.ErrConfig) {
		printErrors(stderr, err)
		err = daemon.ErrConfig
	}
	if err == nil {
		hardStop, release := signalAfter(ctx, os.Interrupt, syscall.SIGTERM)
		defer release()
		err = d.Run(ctx, hardStop)
	}
	if err != nil {
		log.Error("sharelimit stopped", "err", err)
		return 1
	}
	return 0
}
