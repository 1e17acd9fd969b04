package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
)

// Parse reads flags from args; for every flag not given, its SHARELIMIT_*
// variable from getenv; then, for every setting still not given, upstream's
// variable for it (UpstreamVariables), so the precedence is flag >
// SHARELIMIT_* > upstream's name > default. What it did with upstream's
// variables is in the result's Notices. Usage goes to out. It does not
// validate; call Validate.
//
// getenv cannot list names, so Parse sees every variable upstream's settings
// name but not the families only a prefix identifies (OTEL_*); ParseEnviron
// sees those too.
func Parse(name string, args []string, getenv func(string) string, out io.Writer) (*Config, error) {
	return parse(name, args, getenv, nil, false, out)
}

// ParseEnviron is Parse with the environment given as os.Environ gives it,
// "NAME=value" entries (the first of a repeated name counts, as for
// os.Getenv). Knowing every name set, it also names in Notices the variables
// of upstream's families that getenv cannot list (UpstreamVariables' names
// ending in "*").
func ParseEnviron(name string, args, environ []string, out io.Writer) (*Config, error) {
	return parseEnviron(name, args, environ, false, out)
}

// ParseUpstreamCommand is ParseEnviron for the binary run as upstream's
// command, /bin/ratelimit: upstream's mode whatever the environment holds
// (see Config.UpstreamBy).
func ParseUpstreamCommand(name string, args, environ []string, out io.Writer) (*Config, error) {
	return parseEnviron(name, args, environ, true, out)
}

func parseEnviron(name string, args, environ []string, asCommand bool, out io.Writer) (*Config, error) {
	getenv, names := readEnviron(environ)
	return parse(name, args, getenv, names, asCommand, out)
}

// Getenv reads an environment given as os.Environ gives it, "NAME=value"
// entries, as os.Getenv reads the process's: the first of a repeated name
// counts.
func Getenv(environ []string) func(string) string {
	getenv, _ := readEnviron(environ)
	return getenv
}

// readEnviron is Getenv, and also every name set, in order.
func readEnviron(environ []string) (getenv func(string) string, names []string) {
	vars := make(map[string]string, len(environ))
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		if _, seen := vars[k]; !seen {
			vars[k] = v
			names = append(names, k)
		}
	}
	return func(k string) string { return vars[k] }, names
}

// parse is Parse; names, when not nil, are all the variables set; asCommand
// says the binary runs as upstream's command.
func parse(name string, args []string, getenv func(string) string, names []string, asCommand bool, out io.Writer) (*Config, error) {
	c := Defaults()
	fs := c.FlagSet(name)
	fs.SetOutput(out)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	if err := ApplyEnv(fs, getenv); err != nil {
		return nil, err
	}
	notices, err := applyUpstream(fs, c, getenv, names, asCommand)
	if err != nil {
		return nil, err
	}
	c.LogFormat = strings.ToLower(c.LogFormat) // text or json in any case, as LOG_FORMAT
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if host, _, err := net.SplitHostPort(c.HTTPAddr); err == nil && !IsLoopback(host) && !given["local-http-addr"] && !strings.HasPrefix(c.HTTPAddr, "unix:") {
		c.LocalHTTPAddr = DefaultLocalHTTPAddr
	}

	if n, ok := upstreamDefaultDir(c, given["config-dir"], isDir); ok {
		notices = append(notices, n)
	}
	c.Notices = notices
	return c, nil
}

// upstreamDefaultDir: a container that relied on upstream's default config
// directory, and sets nothing, finds its files there. Only when no setting
// named a directory, sharelimit's default does not exist and upstream's does.
func upstreamDefaultDir(c *Config, given bool, isDir func(string) bool) (Notice, bool) {
	up := filepath.Join(upstreamRuntimeRoot, upstreamAppDir)
	if given || c.ConfigType != ConfigFile || c.ConfigDir != Defaults().ConfigDir || isDir(c.ConfigDir) || !isDir(up) {
		return Notice{}, false
	}
	c.ConfigDir, c.ConfigAllFiles = up, true
	return Notice{Level: slog.LevelInfo, Message: "config directory: upstream's default " + up + ", read as upstream reads it (no --config-dir given, and " + Defaults().ConfigDir + " does not exist)"}, true
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

// ApplyEnv sets every flag of fs that was not given on the command line from its
// variable (EnvName), read with getenv; call it after fs.Parse. A flag wins over
// its variable, and an empty variable counts as unset, so the flag keeps its
// default. It reports every bad value at once, each naming its variable. Every
// subcommand that mirrors its flags in the environment uses it, so they all
// follow the one rule the README documents.
func ApplyEnv(fs *flag.FlagSet, getenv func(string) string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		env := EnvName(f.Name)
		if v := getenv(env); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", env, err))
			}
		}
	})
	return errors.Join(errs...)
}

// EnvPrefix starts every variable that mirrors a flag.
const EnvPrefix = "SHARELIMIT_"

// EnvName is the environment variable for a flag: --grpc-addr is
// SHARELIMIT_GRPC_ADDR.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}
