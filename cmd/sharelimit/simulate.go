package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/sharelimit/sharelimit/simulate"
)

// simulateCmd runs `sharelimit simulate`: K replicas in process, equal
// shares and demand shares on the same traffic, side by side.
func simulateCmd(args []string, stdout, stderr io.Writer) int {
	fs, c, events, svg := simulateFlags()
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "sharelimit simulate: unexpected argument %q\n", fs.Arg(0))
		return 2
	}
	var err error
	if c.Events, err = parseEvents(*events); err != nil {
		fmt.Fprintf(stderr, "sharelimit simulate: --events: %v\n", err)
		return 2
	}
	equal, err := simulate.Run(*c)
	if err != nil {
		fmt.Fprintln(stderr, "sharelimit", err)
		return 2
	}
	c.Demand = true
	dem, err := simulate.Run(*c)
	if err != nil {
		fmt.Fprintln(stderr, "sharelimit", err)
		return 2
	}
	simulate.WriteTable(stdout, equal, dem)
	if *svg != "" {
		b, err := simulate.SVG(equal, dem)
		if err == nil {
			err = os.WriteFile(*svg, b, 0o644)
		}
		if err != nil {
			fmt.Fprintf(stderr, "sharelimit simulate: --svg: %v\n", err)
			return 1
		}
	}
	return 0
}

// simulateFlags is simulate's flag set, bound to a config and the two flags
// that are not part of it.
func simulateFlags() (fs *flag.FlagSet, c *simulate.Config, events, svg *string) {
	fs = flag.NewFlagSet("simulate", flag.ContinueOnError)
	c = &simulate.Config{}
	fs.IntVar(&c.Replicas, "replicas", 4, "replicas at the start (K)")
	fs.Float64Var(&c.Limit, "limit", 400, "the global limit L, per second")
	fs.Float64Var(&c.Burst, "burst", 0, "the limit's burst B; 0 = L")
	fs.Float64Var(&c.Offered, "offered", 800, "the offered load, per second, all replicas together")
	fs.StringVar(&c.Shape, "shape", simulate.Hot, "traffic shape: "+strings.Join(simulate.Shapes, ", "))
	fs.DurationVar(&c.Duration, "duration", 60*time.Second, "length of the run, in virtual time")
	fs.DurationVar(&c.Interval, "demand-interval", time.Second, "as the daemon's --demand-interval")
	fs.Float64Var(&c.MaxWrites, "demand-max-writes", 100, "as the daemon's --demand-max-writes")
	fs.DurationVar(&c.Hold, "membership-hold", 2*time.Second, "as the daemon's --membership-hold (equal shares' grows)")
	events = fs.String("events", "", "membership events, AT:+N or AT:-N, comma-separated (20s:+2,40s:-1)")
	svg = fs.String("svg", "", "also draw the run as an SVG chart to this file")
	return fs, c, events, svg
}

// parseEvents reads AT:+N,AT:-N.
func parseEvents(s string) ([]simulate.Event, error) {
	var out []simulate.Event
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		at, delta, ok := strings.Cut(item, ":")
		if !ok {
			return nil, fmt.Errorf("%q: want AT:+N or AT:-N", item)
		}
		d, err := time.ParseDuration(at)
		if err != nil {
			return nil, fmt.Errorf("%q: %w", item, err)
		}
		n, err := strconv.Atoi(delta)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("%q: the change must be a non-zero count such as +2 or -1", item)
		}
		out = append(out, simulate.Event{At: d, Delta: n})
	}
	return out, nil
}
