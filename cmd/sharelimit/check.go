package main

import (
	"flag"
	"fmt"
	"io"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/source"
)

func check(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	replicas := fs.Int("replicas", 1, "warn about shares that drop below one request at this replica count")
	quiet := fs.Bool("q", false, "print nothing on success")
	dump := fs.Bool("v", false, "print the compiled rules")
	merge := fs.Bool("merge-domain-config", false, "merge files that name the same domain, as the daemon's --merge-domain-config")
	allFiles := fs.Bool("config-all-files", false, "read every file under a directory, in subdirectories too, whatever its name (dotfiles skipped), as the daemon's --config-all-files, which is on when the directory comes from upstream's RUNTIME_* variables")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() == 0 || *replicas < 1 {
		fmt.Fprintln(stderr, "usage: sharelimit check [--replicas N] [--merge-domain-config] [--config-all-files] [-q] [-v] PATH...")
		return 2
	}
	// The daemon's loader, with the daemon's options: what passes here loads there.
	opts := source.Options{Compile: descriptors.CompileOptions{MergeDomains: *merge}, AllFiles: *allFiles}
	set, err := source.LoadWith(opts, fs.Args()...)
	if err != nil {
		printErrors(stderr, err)
		return 1
	}
	for _, w := range set.Warnings(*replicas) {
		fmt.Fprintln(stderr, w)
	}
	if *dump {
		fmt.Fprint(stdout, set.Dump())
	}
	if !*quiet {
		limits, perReplica, byDemand := 0, 0, 0
		for _, r := range set.Rules() {
			if l := r.Limit(); l != nil {
				limits++
				switch l.Share() {
				case descriptors.ShareReplica:
					perReplica++
				case descriptors.ShareDemand:
					byDemand++
				}
			}
		}
		fmt.Fprintf(stdout, "ok: %d files, %d domains, %d descriptors, %d limits", len(set.Files()), len(set.Domains()), set.Len(), limits)
		if perReplica > 0 {
			fmt.Fprintf(stdout, " (%d with share: replica, enforced whole by every replica)", perReplica)
		}
		if byDemand > 0 {
			fmt.Fprintf(stdout, " (%d with share: demand, divided by demand)", byDemand)
		}
		fmt.Fprintln(stdout)
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
