package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"io"
	"log/slog"
	"os"
	"strings"
	"syscall"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/daemon"
	"github.com/sharelimit/sharelimit/descriptors"
)

func newLogger(cfg *config.Config, w io.Writer) *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(strings.ToLower(cfg.LogLevel)))
	opts := &slog.HandlerOptions{Level: level}
	if cfg.LogFormat == "json" {
		if len(cfg.UpstreamBy) > 0 {
			opts.ReplaceAttr = logrusNames
		}
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// logrusNames renames a JSON record's fields as upstream's logger wrote
// them (logrus's JSON formatter as upstream configures it): the time
// "@timestamp", the message "@message", and the level in logrus's words, so
// a log pipeline written for upstream keeps reading it.
func logrusNames(groups []string, a slog.Attr) slog.Attr {
	if len(groups) > 0 {
		return a
	}
	switch a.Key {
	case slog.TimeKey:
		a.Key = "@timestamp"
	case slog.MessageKey:
		a.Key = "@message"
	case slog.LevelKey:
		switch l, _ := a.Value.Any().(slog.Level); {
		case l >= slog.LevelError:
			a.Value = slog.StringValue("error")
		case l >= slog.LevelWarn:
			a.Value = slog.StringValue("warning")
		case l >= slog.LevelInfo:
			a.Value = slog.StringValue("info")
		default:
			a.Value = slog.StringValue("debug")
		}
	}
	return a
}

// serve runs the daemon until ctx ends (SIGTERM or SIGINT), then drains. A
// second signal during the stop makes it stop at once. environ is the
// process's environment, as os.Environ gives it; asUpstream says the binary
// runs as upstream's command (see run).
//
// Every error that stops the start is one log record, in the format the
// settings ask for, even when the settings themselves are what is wrong, so a
// log pipeline that parses JSON never meets a bare line.
func serve(ctx context.Context, args, environ []string, asUpstream bool, stderr io.Writer) int {
	parse := config.ParseEnviron
	if asUpstream {
		parse = config.ParseUpstreamCommand
	}
	// Usage goes to stderr for -h alone; a bad flag is one record below.
	var usage bytes.Buffer
	cfg, err := parse("serve", args, environ, &usage)
	if errors.Is(err, flag.ErrHelp) {
		stderr.Write(usage.Bytes())
		return 0
	}
	if err != nil {
		startupLogger(args, environ, asUpstream, stderr).Error("invalid settings at start-up", "err", err.Error())
		return 2
	}
	log := newLogger(cfg, stderr)
	if err := cfg.Validate(); err != nil {
		log.Error("invalid settings at start-up", "errors", lines(err))
		return 2
	}
	for _, n := range cfg.Notices {
		log.Log(ctx, n.Level, n.Message, "variables", n.Vars)
	}
	d, err := daemon.New(cfg, log, version)
	if errors.Is(err, daemon.ErrConfig) {
		errs := configErrors(err)
		log.Error("invalid config at start-up", "dir", cfg.ConfigDir, "errors", errs)
		return 1
	}
	if err == nil {
		hardStop, release := signalAfter(ctx, os.Interrupt, syscall.SIGTERM)
		defer release()
		err = d.Run(ctx, hardStop)
	}
	if err != nil {
		log.Error("sharelimit stopped", "err", err.Error())
		return 1
	}
	return 0
}

// startupLogger is the logger for settings that could not be parsed: the
// format comes from the arguments or the environment as Parse would read it
// (--log-format, SHARELIMIT_LOG_FORMAT, LOG_FORMAT), text when none names a
// valid one, with upstream's field names in upstream's environment.
func startupLogger(args, environ []string, asUpstream bool, w io.Writer) *slog.Logger {
	format := ""
	for i, a := range args {
		if a == "--" {
			break
		}
		name, val, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if name != "log-format" || !strings.HasPrefix(a, "-") {
			continue
		}
		if !hasVal && i+1 < len(args) {
			val = args[i+1]
		}
		format = val
	}
	getenv := config.Getenv(environ)
	for _, v := range []string{format, getenv(config.EnvName("log-format")), getenv("LOG_FORMAT")} {
		if v = strings.ToLower(v); v == "json" || v == "text" {
			format = v
			break
		}
	}
	return newLogger(&config.Config{LogFormat: format, LogLevel: "info", UpstreamBy: config.UpstreamBy(environ, asUpstream)}, w)
}

// lines splits an error of joined errors into its lines.
func lines(err error) []string {
	return strings.Split(strings.TrimSpace(err.Error()), "\n")
}

// configErrors is every config error, file:line:col first.
func configErrors(err error) []string {
	errs := descriptors.Errors(err)
	if len(errs) == 0 {
		return lines(err)
	}
	out := make([]string, len(errs))
	for i, e := range errs {
		out[i] = e.Error()
	}
	return out
}
