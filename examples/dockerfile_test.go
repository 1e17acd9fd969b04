package examples_test

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// instruction is one Dockerfile instruction, continuation lines joined.
type instruction struct {
	cmd  string // upper case: FROM, RUN, ...
	args string
}

type stage struct {
	base, name string
	body       []instruction
}

// parseDockerfile splits a Dockerfile into stages. Comments (and parser
// directives, which are comments too) are dropped.
func parseDockerfile(data string) []stage {
	var stages []stage
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := instruction{cmd: strings.ToUpper(cmd), args: strings.TrimSpace(args)}
		if in.cmd == "FROM" {
			f := strings.Fields(in.args)
			s := stage{}
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				f = f[1:] // --platform=...
			}
			if len(f) > 0 {
				s.base = f[0]
			}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.name = f[2]
			}
			stages = append(stages, s)
			return
		}
		if len(stages) > 0 {
			stages[len(stages)-1].body = append(stages[len(stages)-1].body, in)
		}
	}
	for _, line := range strings.Split(data, "\n") {
		trimmed := strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "#") {
			continue
		}
		if cont, ok := strings.CutSuffix(trimmed, `\`); ok {
			cur.WriteString(cont + " ")
			continue
		}
		cur.WriteString(trimmed)
		flush()
	}
	flush()
	return stages
}

// execForm reads a JSON-array instruction (ENTRYPOINT, CMD).
func execForm(p *problems, in instruction) []string {
	var v []string
	if err := json.Unmarshal([]byte(in.args), &v); err != nil {
		p.addf("Dockerfile: %s %s: use the exec (JSON array) form: the final image has no shell", in.cmd, in.args)
	}
	return v
}

// goModVersion is go.mod's go directive, major.minor.
func goModVersion(gomod string) string {
	m := regexp.MustCompile(`(?m)^go (\d+\.\d+)`).FindStringSubmatch(gomod)
	if m == nil {
		return ""
	}
	return m[1]
}

// checkDockerfile checks the image builds ./cmd/sharelimit statically with the
// module's Go, and runs it from a distroless or scratch base as a non-root
// user, with a default command the daemon accepts.
func checkDockerfile(p *problems, data, gomod string) {
	stages := parseDockerfile(data)
	if len(stages) < 2 {
		p.addf("Dockerfile: %d stages; want a build stage and a final one", len(stages))
		return
	}
	build, final := stages[0], stages[len(stages)-1]

	// The build stage.
	if goVer := goModVersion(gomod); !strings.HasPrefix(build.base, "golang:"+goVer) {
		p.addf("Dockerfile: builds FROM %s, but go.mod asks for go %s", build.base, goVer)
	}
	var out string
	copiedMod := false
	for _, in := range build.body {
		if in.cmd == "COPY" && strings.Contains(in.args, "go.mod") && strings.Contains(in.args, "go.sum") {
			copiedMod = true
		}
		if in.cmd != "RUN" || !strings.Contains(in.args, "go build") {
			continue
		}
		f := strings.Fields(in.args[strings.Index(in.args, "go build"):])
		if pkg := f[len(f)-1]; pkg != "./cmd/sharelimit" {
			p.addf("Dockerfile: go build %s; the binary is ./cmd/sharelimit", pkg)
		}
		for _, want := range []string{"CGO_ENABLED=0", "-trimpath"} {
			if !strings.Contains(in.args, want) {
				p.addf("Dockerfile: the go build step lacks %s", want)
			}
		}
		out, _ = flagValue(f, "o")
	}
	if !copiedMod {
		p.addf("Dockerfile: copy go.mod and go.sum before the source, so module downloads are cached")
	}
	if out == "" {
		p.addf("Dockerfile: the build stage has no `go build -o PATH` step")
	}

	// The final stage.
	if final.base != "scratch" && !strings.HasPrefix(final.base, "gcr.io/distroless/static") {
		p.addf("Dockerfile: the final stage is FROM %s; want gcr.io/distroless/static* or scratch", final.base)
	}
	var user, copied string
	var entrypoint, cmd []string
	volumes := map[string]bool{}
	owned := map[string]string{} // a directory copied in, by its owner
	for _, in := range final.body {
		switch in.cmd {
		case "VOLUME":
			for _, v := range strings.Fields(strings.NewReplacer("[", " ", "]", " ", ",", " ", `"`, " ").Replace(in.args)) {
				volumes[v] = true
			}
		case "USER":
			user = in.args
		case "ENTRYPOINT":
			entrypoint = execForm(p, in)
		case "CMD":
			cmd = execForm(p, in)
		case "COPY":
			f := strings.Fields(in.args)
			if len(f) == 3 && (f[0] == "--from="+build.name || f[0] == "--from=0") && f[1] == out {
				copied = f[2]
			}
			if len(f) == 4 && strings.HasPrefix(f[1], "--chown=") {
				owned[f[3]] = strings.TrimPrefix(f[1], "--chown=")
			}
		}
	}
	uid, _, _ := strings.Cut(user, ":")
	if n, err := strconv.Atoi(uid); err != nil || n == 0 {
		p.addf("Dockerfile: USER %q: want a numeric non-root user (Kubernetes' runAsNonRoot cannot verify a name)", user)
	}
	switch {
	case copied == "":
		p.addf("Dockerfile: the final stage does not copy %s from the build stage", out)
	case len(entrypoint) != 1 || entrypoint[0] != copied:
		p.addf("Dockerfile: ENTRYPOINT %v; want [%q], the binary the build stage made", entrypoint, copied)
	}
	// A VOLUME the image's user can write: the state file lives there, and a
	// volume outlives the container.
	for v := range volumes {
		if owned[v] != user {
			p.addf("Dockerfile: VOLUME %s is not copied in owned by USER %s: the daemon could not write its state there", v, user)
		}
	}
	checkDaemon(p, daemon{where: "Dockerfile: CMD", args: cmd, stateDirs: volumes,
		mounts: map[string]string{"/etc/sharelimit/config": filepath.Join(repo, "examples", "config")}})
}

func TestDockerfile(t *testing.T) {
	t.Parallel()
	var p problems
	checkDockerfile(&p, string(readFile(t, "Dockerfile")), string(readFile(t, "go.mod")))
	p.report(t)
}

// dockerignored reports whether Docker leaves path (slash-separated, relative
// to the context) out of the build context. A pattern that matches a directory
// excludes everything under it; the last matching pattern wins, and ! re-includes.
func dockerignored(patterns []string, path string) bool {
	ignored := false
	for _, pat := range patterns {
		neg := strings.HasPrefix(pat, "!")
		re := dockerPattern(strings.TrimPrefix(pat, "!"))
		for dir := path; dir != "."; dir = filepath.ToSlash(filepath.Dir(dir)) {
			if re.MatchString(dir) {
				ignored = !neg
				break
			}
		}
	}
	return ignored
}

// dockerPattern turns a .dockerignore pattern into a regexp, with Docker's
// meaning: * and ? stay within a path element, ** spans any number of them.
func dockerPattern(pat string) *regexp.Regexp {
	pat = strings.TrimPrefix(filepath.ToSlash(filepath.Clean(pat)), "/")
	var b strings.Builder
	b.WriteString("^")
	for i := 0; i < len(pat); i++ {
		switch c := pat[i]; {
		case strings.HasPrefix(pat[i:], "**/"):
			b.WriteString("(?:.*/)?")
			i += 2
		case strings.HasPrefix(pat[i:], "**"):
			b.WriteString(".*")
			i++
		case c == '*':
			b.WriteString("[^/]*")
		case c == '?':
			b.WriteString("[^/]")
		default:
			b.WriteString(regexp.QuoteMeta(string(c)))
		}
	}
	b.WriteString("$")
	return regexp.MustCompile(b.String())
}

// dockerignorePatterns reads .dockerignore.
func dockerignorePatterns(data string) []string {
	var out []string
	for _, line := range strings.Split(data, "\n") {
		if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
			out = append(out, line)
		}
	}
	return out
}

// buildInputs lists, relative to the repository, every file `go build
// ./cmd/sharelimit` reads from the module: the Go and embedded files of each
// package it depends on, and go.mod and go.sum.
func buildInputs(t *testing.T) []string {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-f",
		`{{if .Module}}{{if .Module.Main}}{{$d := .Dir}}{{range .GoFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{range .EmbedFiles}}{{$d}}/{{.}}{{"\n"}}{{end}}{{end}}{{end}}`,
		"./cmd/sharelimit")
	cmd.Dir = repo
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	root, err := filepath.Abs(repo)
	if err != nil {
		t.Fatal(err)
	}
	files := []string{"go.mod", "go.sum"}
	for _, f := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, f)
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.ToSlash(rel))
	}
	if len(files) < 10 {
		t.Fatalf("go list found only %v: the check would test nothing", files)
	}
	return files
}

func checkDockerignore(p *problems, patterns, inputs []string) {
	for _, f := range inputs {
		if dockerignored(patterns, f) {
			p.addf(".dockerignore leaves %s out of the build context, and go build ./cmd/sharelimit needs it", f)
		}
	}
}

func TestDockerignore(t *testing.T) {
	t.Parallel()
	var p problems
	checkDockerignore(&p, dockerignorePatterns(string(readFile(t, ".dockerignore"))), buildInputs(t))
	p.report(t)
}

// TestDockerignoreMatcher pins the matcher the check above relies on.
func TestDockerignoreMatcher(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		patterns []string
		path     string
		want     bool
	}{
		{[]string{"examples"}, "examples/config/edge.yaml", true},
		{[]string{"examples"}, "cmd/sharelimit/main.go", false},
		{[]string{"**/testdata"}, "descriptors/testdata/valid/a.yaml", true},
		{[]string{"**/*_test.go"}, "server/admin_test.go", true},
		{[]string{"**/*_test.go"}, "server/admin.go", false},
		{[]string{"*.go"}, "server/admin.go", false},
		{[]string{"*.go"}, "main.go", true},
		{[]string{"server", "!server/admin.go"}, "server/admin.go", false},
		{[]string{"/config"}, "config/config.go", true},
		{[]string{"conf?g"}, "config/config.go", true},
	} {
		if got := dockerignored(tc.patterns, tc.path); got != tc.want {
			t.Errorf("dockerignored(%q, %q) = %v, want %v", tc.patterns, tc.path, got, tc.want)
		}
	}
}
