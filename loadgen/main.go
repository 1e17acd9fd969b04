package loadgen

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/internal/gcpace"
)

// progressAuto: with no --progress flag, progress lines go to stderr when the run
// may last longer than this, or has no time bound at all.
const progressAuto = 5 * time.Second

// options are the bench flags.
type options struct {
	target      string
	conns       int
	concurrency int
	duration    time.Duration
	requests    uint64
	rate        float64
	descriptors int
	shape       string
	cardinality int
	hitsAddend  uint64
	domain      string
	warmup      time.Duration
	timeout     time.Duration
	json        bool
	serverPID   int
	progress    autoBool
	serveNoop   string
	noopServer  string

	targetA, targetB string
	pidA, pidB       int
	labelA, labelB   string
	rounds           int
}

func (o *options) register(fs *flag.FlagSet) {
	fs.StringVar(&o.target, "target", "127.0.0.1:8081", "comma-separated `addresses` (host:port or unix:/path); workers are spread over them round-robin")
	fs.IntVar(&o.conns, "conns", 1, "gRPC (HTTP/2) connections per target")
	fs.IntVar(&o.concurrency, "concurrency", 0, "workers, i.e. most calls in flight; 0: 16 in closed loop, in open loop enough to cover 4ms of the schedule (at least 16)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "measured window, at most 1h; with --requests, whichever ends first (when only --requests is given, this default does not apply)")
	fs.Uint64Var(&o.requests, "requests", 0, "end the measured window after this many requests (0: --duration alone)")
	fs.Float64Var(&o.rate, "rate", 0, "open loop: total requests per second on a fixed schedule, latency timed from the schedule; 0: closed loop")
	fs.IntVar(&o.descriptors, "descriptors", 1, "descriptors per request (1.."+strconv.Itoa(MaxDescriptors)+")")
	fs.StringVar(&o.shape, "shape", string(ShapeGenericKey), "descriptor `shape`: generic_key {generic_key=key-N}, remote_address {remote_address=10.a.b.c}, nested {path="+NestedPath+", remote_address=10.a.b.c}, mix (3 descriptors: fixed, wildcard path, per-IP; a 4th, binding, on 1 request in 10)")
	fs.IntVar(&o.cardinality, "cardinality", 1, "distinct descriptor values, walked round-robin (1..10000000)")
	fs.Uint64Var(&o.hitsAddend, "hits-addend", 0, "request hits_addend (0: the server counts 1, as Envoy's default)")
	fs.StringVar(&o.domain, "domain", DefaultDomain, "request domain")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "load to run and discard before the measured window")
	fs.DurationVar(&o.timeout, "timeout", 0, "per-call deadline, as Envoy's filter sets (0: none)")
	fs.BoolVar(&o.json, "json", false, "write the result as JSON instead of a table")
	fs.IntVar(&o.serverPID, "server-pid", 0, "`pid` of the server; its CPU time is read from /proc around the window and reported per decision")
	fs.Var(&o.progress, "progress", "a progress line on stderr every second (default: on when the run may last more than 5s)")
	fs.StringVar(&o.serveNoop, "serve-noop", "", "instead of load, serve the no-op RLS (the gRPC floor) on this `address` until stopped")
	fs.StringVar(&o.noopServer, "noop-server", string(NoopTuned), "with --serve-noop: `kind` of gRPC server, tuned (serve's grpc-go options and GC pacing) or plain (grpc.NewServer() defaults, Go's default GC)")

	fs.StringVar(&o.targetA, "target-a", "", "compare mode: baseline `addresses` (usually the no-op server); with --target-b runs A,B,A,B,...")
	fs.StringVar(&o.targetB, "target-b", "", "compare mode: candidate `addresses` (usually sharelimit); ratios are B/A")
	fs.IntVar(&o.pidA, "pid-a", 0, "compare mode: `pid` of A's server, for CPU per decision")
	fs.IntVar(&o.pidB, "pid-b", 0, "compare mode: `pid` of B's server, for CPU per decision")
	fs.StringVar(&o.labelA, "label-a", "A", "compare mode: name of A in the table")
	fs.StringVar(&o.labelB, "label-b", "B", "compare mode: name of B in the table")
	fs.IntVar(&o.rounds, "rounds", 4, "compare mode: rounds; each runs A then B, each with --warmup then --duration")
}

// autoBool is a boolean flag that remembers whether it was set at all.
type autoBool struct{ set, val bool }

func (a *autoBool) String() string {
	if a == nil || !a.set {
		return "auto"
	}
	return strconv.FormatBool(a.val)
}

func (a *autoBool) Set(s string) error {
	if s == "auto" {
		*a = autoBool{}
		return nil
	}
	v, err := strconv.ParseBool(s)
	if err != nil {
		return errors.New("want true, false or auto")
	}
	*a = autoBool{set: true, val: v}
	return nil
}

func (a *autoBool) IsBoolFlag() bool { return true }

// compareOnly are the flags that only compare mode takes.
func compareOnly() []string { return []string{"pid-a", "pid-b", "label-a", "label-b", "rounds"} }

// FlagSet returns bench's flags, unparsed: for checks that the documentation
// names only flags that exist.
func FlagSet() *flag.FlagSet {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var o options
	o.register(fs)
	return fs
}

// noopAllowed reports whether --serve-noop takes the flag.
func noopAllowed(name string) bool {
	return name == "serve-noop" || name == "noop-server" || name == "json"
}

// Main is `sharelimit bench`. It returns the exit code: 0 when the run completed
// (whatever the server answered), 2 for bad usage, 1 when the run could not be
// done or was interrupted. Cancelling ctx stops a run (partial figures are still
// printed) or the no-op server (exit 0). Flags not given are read from the
// process environment, as config.ApplyEnv does for serve.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return benchMain(ctx, args, os.Getenv, stdout, stderr)
}

// benchMain is Main with the environment passed in, so tests need not set the
// process's.
func benchMain(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o options
	o.register(fs)
	fs.Usage = func() { usage(fs) }
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		return usageError(stderr, fmt.Errorf("unexpected argument %q", fs.Arg(0)))
	}
	onCmdline := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { onCmdline[f.Name] = true })
	if err := config.ApplyEnv(fs, getenv); err != nil {
		return usageError(stderr, err)
	}
	given := map[string]bool{} // on the command line or in the environment
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })

	if o.serveNoop != "" {
		for _, name := range slices.Sorted(maps.Keys(onCmdline)) {
			if !noopAllowed(name) {
				return usageError(stderr, fmt.Errorf("--%s: --serve-noop runs a server and takes no load flags", name))
			}
		}
		kind, err := ParseNoopServer(o.noopServer)
		if err != nil {
			return usageError(stderr, err)
		}
		return serveNoopMain(ctx, o.serveNoop, kind, o.json, stdout, stderr)
	}
	if onCmdline["noop-server"] {
		return usageError(stderr, fmt.Errorf("--noop-server: only with --serve-noop"))
	}

	load, err := o.load(given, stderr)
	if err != nil {
		return usageError(stderr, err)
	}
	if given["target-a"] || given["target-b"] {
		return compareMain(ctx, &o, load, onCmdline, stdout, stderr)
	}
	for _, name := range compareOnly() {
		if onCmdline[name] {
			return usageError(stderr, fmt.Errorf("--%s: only with --target-a and --target-b", name))
		}
	}
	if err := load.Validate(); err != nil {
		return usageError(stderr, err)
	}
	res, err := Run(ctx, load)
	if err == nil || res.Interrupted && res.Requests > 0 {
		if werr := output(stdout, o.json, res); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	return 0
}

// load turns the flags into the Config of every run. Progress goes to stderr.
func (o *options) load(given map[string]bool, stderr io.Writer) (Config, error) {
	if o.hitsAddend > math.MaxUint32 {
		return Config{}, fmt.Errorf("hits-addend: %d does not fit in 32 bits", o.hitsAddend)
	}
	for _, f := range []struct {
		name string
		v    int
	}{{"conns", o.conns}, {"descriptors", o.descriptors}, {"cardinality", o.cardinality}} {
		if f.v == 0 {
			return Config{}, fmt.Errorf("%s: must be at least 1", f.name)
		}
	}
	if o.domain == "" {
		return Config{}, errors.New("domain: empty")
	}
	duration := o.duration
	if given["requests"] && !given["duration"] {
		duration = 0
	}
	load := Config{
		Targets:     splitList(o.target),
		Conns:       o.conns,
		Concurrency: o.concurrency,
		Duration:    duration,
		Requests:    o.requests,
		Rate:        o.rate,
		Descriptors: o.descriptors,
		Shape:       Shape(o.shape),
		Cardinality: o.cardinality,
		HitsAddend:  uint32(o.hitsAddend),
		Domain:      o.domain,
		Warmup:      o.warmup,
		Timeout:     o.timeout,
		ServerPID:   o.serverPID,
	}
	progress := o.progress.val
	if !o.progress.set {
		progress = load.Duration == 0 || load.Duration+load.Warmup > progressAuto
	}
	if progress {
		load.Progress = stderr
	}
	return load, nil
}

func compareMain(ctx context.Context, o *options, load Config, onCmdline map[string]bool, stdout, stderr io.Writer) int {
	for _, name := range []string{"target", "server-pid"} {
		if onCmdline[name] {
			return usageError(stderr, fmt.Errorf("--%s: not used in compare mode; give --target-a/--target-b and --pid-a/--pid-b", name))
		}
	}
	if o.rounds == 0 {
		return usageError(stderr, errors.New("rounds: must be at least 1"))
	}
	cc := CompareConfig{
		Load:   load,
		A:      Side{Label: o.labelA, Targets: splitList(o.targetA), ServerPID: o.pidA},
		B:      Side{Label: o.labelB, Targets: splitList(o.targetB), ServerPID: o.pidB},
		Rounds: o.rounds,
	}
	if err := cc.Validate(); err != nil {
		return usageError(stderr, err)
	}
	c, err := Compare(ctx, cc)
	if err == nil || len(c.A.Runs) > 0 {
		if werr := output(stdout, o.json, c); werr != nil && err == nil {
			err = werr
		}
	}
	if err != nil {
		fmt.Fprintf(stderr, "bench: %v\n", err)
		return 1
	}
	return 0
}

// usageError prints err, one line per joined error, and returns the usage exit
// code.
func usageError(stderr io.Writer, err error) int {
	for line := range strings.SplitSeq(err.Error(), "\n") {
		fmt.Fprintf(stderr, "bench: %s\n", line)
	}
	fmt.Fprintln(stderr, "bench: run 'sharelimit bench -h' for usage")
	return 2
}

type report interface {
	WriteTable(io.Writer) error
	WriteJSON(io.Writer) error
}

var (
	_ report = Result{}
	_ report = Comparison{}
)

func output(w io.Writer, asJSON bool, r report) error {
	if asJSON {
		return r.WriteJSON(w)
	}
	return r.WriteTable(w)
}

func serveNoopMain(ctx context.Context, addr string, kind NoopServer, asJSON bool, stdout, stderr io.Writer) int {
	if kind == NoopTuned {
		// The tuned floor runs with serve's runtime settings, GC pacing
		// included, or the comparison would measure the collector, not the
		// decision. The plain one keeps Go's defaults.
		tctx, stopTuner := context.WithCancel(ctx)
		tuned := make(chan struct{})
		go func() { gcpace.Tuner{}.Run(tctx); close(tuned) }()
		defer func() { stopTuner(); <-tuned }()
	}
	lis, err := listen(addr)
	if err != nil {
		fmt.Fprintf(stderr, "bench: serve-noop: %v\n", err)
		return 1
	}
	bound := lis.Addr().String()
	if lis.Addr().Network() == "unix" {
		bound = "unix:" + bound
	}
	if asJSON {
		_ = writeJSON(stdout, map[string]string{"serve_noop": bound})
	} else {
		fmt.Fprintf(stdout, "bench: no-op RLS server (%s) listening on %s\n", kind, bound)
	}
	if err := ServeNoop(ctx, lis, kind); err != nil {
		fmt.Fprintf(stderr, "bench: serve-noop: %v\n", err)
		return 1
	}
	return 0
}

// listen opens a TCP listener, or a unix socket for "unix:/path".
func listen(addr string) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		return net.Listen("unix", strings.TrimPrefix(path, "//"))
	}
	return net.Listen("tcp", addr)
}

func splitList(s string) []string {
	var out []string
	for part := range strings.SplitSeq(s, ",") {
		if p := strings.TrimSpace(part); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func usage(fs *flag.FlagSet) {
	w := fs.Output()
	fmt.Fprint(w, `usage:
  sharelimit bench [flags]
      load one target, or several round-robin, and report throughput,
      answers, latency and (with --server-pid) server CPU per decision
  sharelimit bench --target-a ADDR --target-b ADDR [--pid-a PID --pid-b PID] [--rounds N] [flags]
      alternate A,B,A,B,... with the same load; per-run rows, medians, B/A
  sharelimit bench --serve-noop ADDR
      serve the no-op RLS (the gRPC floor) until interrupted

Requests walk the key space round-robin: descriptor j of request s uses value
(s*descriptors+j) mod cardinality. Each flag is also read from
SHARELIMIT_<FLAG_IN_UPPER_SNAKE> (e.g. SHARELIMIT_HITS_ADDEND); flags win.

flags:
`)
	fs.PrintDefaults()
}
