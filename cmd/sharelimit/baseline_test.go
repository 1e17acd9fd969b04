package main

// The baseline: what sharelimit says to its operators and to Envoy, recorded
// before the structural refactor of issue 32 and checked on every commit of it
// (and after), because that refactor must not change behaviour.
//
// It records, under testdata/baseline/:
//   - cli/: `check -v`, `check` with the replica warnings, and `explain` over
//     a frozen copy of every YAML file the repository held when the baseline
//     was taken (corpus/; see TestBaselineCLI);
//   - daemon/: the answers of a real daemon, run in process through serve, to
//     a fixed request script over real gRPC and /json, then its /metrics,
//     /rlconfig (text and JSON), /rlconfig/admitted, /rlconfig/history, the
//     status page, the debug listener's pages, the metrics listener's
//     exposition, and its log from start to stop (see TestBaselineDaemon).
//
// Figures that depend on time are masked (baseline_mask_test.go says which
// and why), never the rest. `go test ./cmd/sharelimit -run Baseline
// -update-baseline` rewrites the goldens: do that only for a change meant to
// change behaviour, and read the diff.

import (
	"bytes"
	"cmp"
	"context"
	"flag"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"

	"gopkg.in/yaml.v3"
)

const baselineDir = "testdata/baseline"

// updateBaseline rewrites the baseline. It is not -update, which rewrites
// this package's other goldens: fixing one of those during a refactor must
// not quietly move the baseline too.
var updateBaseline = flag.Bool("update-baseline", false, "rewrite the goldens under testdata/baseline (only for a change meant to change behaviour)")

// baselineGolden compares got with testdata/baseline/name, or rewrites it
// with -update-baseline, as testutil.Golden does with -update. A difference
// is shown as the lines that differ, under their step or command.
func baselineGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join(baselineDir, name)
	if *updateBaseline {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read the baseline (run with -update-baseline to create it): %v", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from the baseline (-want +got):\n%s", path, lineDiff(string(want), got))
	}
}

// lineDiff shows the lines that differ between want and got, each with its
// line number (in want for -, in got for +), at most 60 of them.
func lineDiff(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	// The common head and tail first, then a longest common subsequence of
	// the rest, when it is small enough to tabulate.
	head := 0
	for head < len(w) && head < len(g) && w[head] == g[head] {
		head++
	}
	tail := 0
	for tail < len(w)-head && tail < len(g)-head && w[len(w)-1-tail] == g[len(g)-1-tail] {
		tail++
	}
	mw, mg := w[head:len(w)-tail], g[head:len(g)-tail]
	var b strings.Builder
	shown, lastHeading := 0, ""
	show := func(sign string, n int, l string) {
		if shown++; shown > 60 {
			return
		}
		// The heading the line is under: the step, page or command.
		lines := w
		if sign == "+" {
			lines = g
		}
		for k := n - 1; k >= 0; k-- {
			if h := lines[k]; strings.HasPrefix(h, "## ") || strings.HasPrefix(h, "$ sharelimit ") {
				if h != lastHeading {
					fmt.Fprintf(&b, "@@ %s\n", h)
					lastHeading = h
				}
				break
			}
		}
		if strings.ContainsFunc(l, func(r rune) bool { return unicode.IsSpace(r) && r != ' ' }) {
			l = strconv.Quote(l) // whitespace that does not show
		}
		fmt.Fprintf(&b, "%s%5d  %s\n", sign, n, l)
	}
	if len(mw)*len(mg) > 16<<20 {
		for i, l := range mw {
			show("-", head+i+1, l)
		}
		for i, l := range mg {
			show("+", head+i+1, l)
		}
	} else {
		// lcs[i*(len(mg)+1)+j]: the longest common subsequence of mw[i:] and mg[j:].
		cols := len(mg) + 1
		lcs := make([]int32, (len(mw)+1)*cols)
		for i := len(mw) - 1; i >= 0; i-- {
			for j := len(mg) - 1; j >= 0; j-- {
				if mw[i] == mg[j] {
					lcs[i*cols+j] = lcs[(i+1)*cols+j+1] + 1
				} else {
					lcs[i*cols+j] = max(lcs[(i+1)*cols+j], lcs[i*cols+j+1])
				}
			}
		}
		i, j := 0, 0
		for i < len(mw) || j < len(mg) {
			switch {
			case i < len(mw) && j < len(mg) && mw[i] == mg[j]:
				i, j = i+1, j+1
			case i < len(mw) && (j == len(mg) || lcs[(i+1)*cols+j] >= lcs[i*cols+j+1]):
				show("-", head+i+1, mw[i])
				i++
			default:
				show("+", head+j+1, mg[j])
				j++
			}
		}
	}
	if shown > 60 {
		fmt.Fprintf(&b, "... and %d more lines that differ\n", shown-60)
	}
	return b.String()
}

// cliRecord runs the CLI in process and records the command, its exit code,
// stdout and stderr.
func cliRecord(b *bytes.Buffer, args ...string) int {
	var stdout, stderr bytes.Buffer
	code := run(context.Background(), append([]string{"sharelimit"}, args...), &stdout, &stderr)
	fmt.Fprintf(b, "$ sharelimit %s\nexit %d\n", strings.Join(args, " "), code)
	for _, s := range []struct {
		name string
		out  *bytes.Buffer
	}{{"stdout", &stdout}, {"stderr", &stderr}} {
		if s.out.Len() == 0 {
			continue
		}
		fmt.Fprintf(b, "--- %s\n%s", s.name, s.out.String())
		if !bytes.HasSuffix(s.out.Bytes(), []byte("\n")) {
			b.WriteString("\n[no newline at the end]\n")
		}
	}
	b.WriteString("\n")
	return code
}

// TestBaselineCLI records check and explain over the corpus: a copy of every
// YAML file in the repository (descriptor files valid and invalid, upstream's
// test configs, the examples, and the files that are not descriptor YAML at
// all, such as the compose file and the Kubernetes manifests), taken with the
// baseline. A copy, not the files themselves: tests move and new ones are
// added during a refactor, and the baseline must keep asking the same
// questions. One golden per corpus directory holds, for each file, `check -v`
// and, for each file that checks clean, `check -q --replicas 64` (the
// warnings) and `explain` for a request made from each of its rules (see
// explainRequests); then `check -v` of the directory as --config-dir reads
// it, and with --merge-domain-config. all-files.golden is the whole corpus
// read with --config-all-files, as upstream's RUNTIME_* directory is.
func TestBaselineCLI(t *testing.T) {
	t.Parallel()
	root := filepath.Join(baselineDir, "corpus")
	files := map[string][]string{} // directory: its YAML files
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if ext := filepath.Ext(path); ext == ".yaml" || ext == ".yml" {
			files[filepath.Dir(path)] = append(files[filepath.Dir(path)], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 20 {
		t.Fatalf("the corpus holds %d directories of YAML: it is not where it should be", len(files))
	}
	explained := 0
	produced := map[string]bool{"all-files.golden": true}
	for _, dir := range slices.Sorted(maps.Keys(files)) {
		rel, _ := filepath.Rel(root, dir)
		var b bytes.Buffer
		for _, f := range slices.Sorted(slices.Values(files[dir])) {
			if cliRecord(&b, "check", "-v", f) != 0 {
				continue
			}
			cliRecord(&b, "check", "-q", "--replicas", "64", f)
			for _, req := range explainRequests(t, f) {
				cliRecord(&b, append([]string{"explain", "--config-dir", f, "--replicas", "4"}, req...)...)
				explained++
			}
		}
		cliRecord(&b, "check", "-v", dir)
		if len(files[dir]) > 1 {
			cliRecord(&b, "check", "-v", "--merge-domain-config", dir)
		}
		if rel == "." {
			rel = "top"
		}
		produced[rel+".golden"] = true
		baselineGolden(t, filepath.Join("cli", rel+".golden"), b.String())
	}
	// Every file under the corpus, as upstream's RUNTIME_* directory is read.
	var b bytes.Buffer
	cliRecord(&b, "check", "-v", "--config-all-files", root)
	cliRecord(&b, "check", "-v", "--config-all-files", "--merge-domain-config", root)
	baselineGolden(t, filepath.Join("cli", "all-files.golden"), b.String())
	// A golden whose corpus directory is gone would be compared with nothing.
	filepath.WalkDir(filepath.Join(baselineDir, "cli"), func(path string, d fs.DirEntry, err error) error {
		rel, _ := filepath.Rel(filepath.Join(baselineDir, "cli"), path)
		if err == nil && !d.IsDir() && !produced[rel] {
			t.Errorf("%s: no corpus directory produces it: the corpus lost files", path)
		}
		return nil
	})
	if explained < 100 {
		t.Fatalf("only %d explains: the requests are not being derived from the rules", explained)
	}
}

// explainRequests derives explain's arguments from a descriptor file's rules,
// mechanically: for every rule, the request of its path from the top (each
// level's key with its value; a wildcard's * as "x"; a key-only rule "v1"),
// then, for the file, every top-level rule's request in one request (so
// replaces shows), the first key with an empty value, a key no rule has,
// and a domain no file defines.
func explainRequests(t *testing.T, file string) [][]string {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Domain      string       `yaml:"domain"`
		Descriptors []yamlRuleIn `yaml:"descriptors"`
	}
	if err := yaml.Unmarshal(data, &doc); err != nil || doc.Domain == "" {
		return nil // YAML only upstream's reader takes: the checks record it
	}
	domain := []string{"--domain", doc.Domain}
	var out [][]string
	var walk func(path []string, rules []yamlRuleIn)
	walk = func(path []string, rules []yamlRuleIn) {
		for _, r := range rules {
			p := append(slices.Clone(path), r.Key+"="+r.sample())
			out = append(out, append(slices.Clone(domain), p...))
			walk(p, r.Descriptors)
		}
	}
	walk(nil, doc.Descriptors)
	if len(doc.Descriptors) == 0 {
		return append(out, append(slices.Clone(domain), "a=b"))
	}
	all := slices.Clone(domain)
	for i, r := range doc.Descriptors {
		if i > 0 {
			all = append(all, "+")
		}
		all = append(all, r.Key+"="+r.sample())
	}
	return append(out, all,
		append(slices.Clone(domain), doc.Descriptors[0].Key+"="),
		append(slices.Clone(domain), "no_such_key=v1"),
		[]string{"--domain", "no_such_domain", doc.Descriptors[0].Key + "=" + doc.Descriptors[0].sample()})
}

// yamlRuleIn is what explainRequests reads of a rule.
type yamlRuleIn struct {
	Key         string       `yaml:"key"`
	Value       string       `yaml:"value"`
	Descriptors []yamlRuleIn `yaml:"descriptors"`
}

// sample is a request value the rule matches.
func (r yamlRuleIn) sample() string {
	return cmp.Or(strings.ReplaceAll(r.Value, "*", "x"), "v1")
}
