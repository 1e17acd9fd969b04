package main

import (
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/sharelimit/sharelimit/descriptors"
)

// envoyDefaultTimeout is the rate-limit filter's default timeout: a max_wait not
// under it means Envoy gives up before the answer comes.
const envoyDefaultTimeout = 20 * time.Millisecond

func check(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	replicas := fs.Int("replicas", 1, "warn about shares that drop below one request at this replica count")
	quiet := fs.Bool("q", false, "print nothing on success")
	dump := fs.Bool("v", false, "print the compiled rules")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 || *replicas < 1 {
		fmt.Fprintln(stderr, "usage: sharelimit check [--replicas N] [-q] [-v] PATH...")
		return 2
	}
	set, err := descriptors.LoadPaths(fs.Args()...)
	if err != nil {
		printErrors(stderr, err)
		return 1
	}
	for _, w := range Warnings(set, *replicas) {
		fmt.Fprintln(stderr, w)
	}
	if *dump {
		fmt.Fprint(stdout, set.Dump())
	}
	if !*quiet {
		limits := 0
		for _, r := range set.Rules {
			if r.Limit != nil {
				limits++
			}
		}
		fmt.Fprintf(stdout, "ok: %d files, %d domains, %d descriptors, %d limits\n", len(set.Files), len(set.Domains), len(set.Rules), limits)
	}
	return 0
}

// printErrors writes every config error, one per line, file:line:col first.
func printErrors(w io.Writer, err error) {
	errs := descriptors.Errors(err)
	if len(errs) == 0 {
		fmt.Fprintln(w, err)
		return
	}
	for _, e := range errs {
		fmt.Fprintln(w, e)
	}
}

// Warnings are the things that are valid but probably not what the author
// meant; they never fail a check.
func Warnings(set *descriptors.Set, replicas int) []string {
	var out []string
	w := 1 / float64(replicas)
	for _, r := range set.Rules {
		l := r.Limit
		if l == nil || l.Unlimited {
			continue
		}
		if !l.Params.Blocked() && l.Params.Size*w < 1 {
			out = append(out, fmt.Sprintf("%s: %s: warning: a burst of %d over %d replicas is %.3g per replica; each replica still admits 1, so the cluster may admit up to %d per window",
				r.Pos, r.Path, l.Burst, replicas, l.Params.Size*w, replicas))
		}
		if l.Policy == descriptors.Wait && l.MaxWait >= envoyDefaultTimeout {
			out = append(out, fmt.Sprintf("%s: %s: warning: max_wait %s is not under Envoy's default rate-limit timeout of 20ms; raise the filter's timeout or Envoy will give up first",
				r.Pos, r.Path, l.MaxWait))
		}
	}
	return out
}
