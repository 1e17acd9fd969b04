package main

import (
	"flag"
	"fmt"
	"io"
	"strings"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/source"
)

// explain prints how one descriptor would be matched and limited, level by level.
func explain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("config-dir", "", "descriptor directory (or file)")
	domain := fs.String("domain", "", "the request's domain")
	replicas := fs.Int("replicas", 1, "replica count: the share is 1/N")
	weight := fs.Float64("weight", 0, "this replica's weight, instead of --replicas")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" || *domain == "" || fs.NArg() == 0 || *replicas < 1 || *weight < 0 || *weight > 1 {
		fmt.Fprintln(stderr, "usage: sharelimit explain --config-dir DIR --domain D [--replicas N | --weight W] key=value... [+ key=value...]")
		return 2
	}
	w := 1 / float64(*replicas)
	if *weight > 0 {
		w = *weight
	}
	// A lone "+" separates the descriptors of one request.
	descs := [][]*commonv3.RateLimitDescriptor_Entry{nil}
	for _, kv := range fs.Args() {
		if kv == "+" {
			descs = append(descs, nil)
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			fmt.Fprintf(stderr, "sharelimit explain: %q: want key=value (value may be empty)\n", kv)
			return 2
		}
		descs[len(descs)-1] = append(descs[len(descs)-1], &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	for _, d := range descs {
		if len(d) == 0 {
			fmt.Fprintln(stderr, "sharelimit explain: an empty descriptor (check the + separators)")
			return 2
		}
	}
	set, err := source.Load(*dir)
	if err != nil {
		printErrors(stderr, err)
		return 1
	}
	descriptors.Explain(stdout, set, *domain, descs, w)
	return 0
}
