package examples_test

import (
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/sharelimit/sharelimit/internal/dockerfile"
)

// execForm reads a JSON-array instruction (ENTRYPOINT, CMD).
func execForm(p *problems, in dockerfile.Instruction) []string {
	v, err := dockerfile.ExecForm(in)
	if err != nil {
		p.addf("Dockerfile: %v: use the exec (JSON array) form: the final image has no shell", err)
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
	stages := dockerfile.Parse(data)
	if len(stages) < 2 {
		p.addf("Dockerfile: %d stages; want a build stage and a final one", len(stages))
		return
	}
	build, final := stages[0], stages[len(stages)-1]

	// The build stage.
	if goVer := goModVersion(gomod); !strings.HasPrefix(build.Base, "golang:"+goVer) {
		p.addf("Dockerfile: builds FROM %s, but go.mod asks for go %s", build.Base, goVer)
	}
	var out string
	copiedMod := false
	for _, in := range build.Body {
		if in.Cmd == "COPY" && strings.Contains(in.Args, "go.mod") && strings.Contains(in.Args, "go.sum") {
			copiedMod = true
		}
		if in.Cmd != "RUN" || !strings.Contains(in.Args, "go build") {
			continue
		}
		f := strings.Fields(in.Args[strings.Index(in.Args, "go build"):])
		if pkg := f[len(f)-1]; pkg != "./cmd/sharelimit" {
			p.addf("Dockerfile: go build %s; the binary is ./cmd/sharelimit", pkg)
		}
		for _, want := range []string{"CGO_ENABLED=0", "-trimpath"} {
			if !strings.Contains(in.Args, want) {
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
	if final.Base != "scratch" && !strings.HasPrefix(final.Base, "gcr.io/distroless/static") {
		p.addf("Dockerfile: the final stage is FROM %s; want gcr.io/distroless/static* or scratch", final.Base)
	}
	var user, copied string
	var entrypoint, cmd []string
	env := map[string]string{}
	links := map[string]string{} // a directory copied in from the build stage, by where it lands
	volumes := map[string]bool{}
	owned := map[string]string{} // a directory copied in, by its owner
	for _, in := range final.Body {
		switch in.Cmd {
		case "VOLUME":
			for _, v := range strings.Fields(strings.NewReplacer("[", " ", "]", " ", ",", " ", `"`, " ").Replace(in.Args)) {
				volumes[v] = true
			}
		case "USER":
			user = in.Args
		case "ENTRYPOINT":
			entrypoint = execForm(p, in)
		case "CMD":
			cmd = execForm(p, in)
		case "ENV":
			kv, err := dockerfile.Env(in)
			if err != nil {
				p.addf("Dockerfile: %v", err)
			}
			for _, e := range kv {
				env[e[0]] = e[1]
			}
		case "COPY":
			f := strings.Fields(in.Args)
			if len(f) == 3 && (f[0] == "--from="+build.Name || f[0] == "--from=0") && f[1] == out {
				copied = f[2]
			}
			if len(f) == 3 && (f[0] == "--from="+build.Name || f[0] == "--from=0") && strings.HasSuffix(f[1], "/") {
				links[f[2]] = f[1]
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
	// Upstream's command, /bin/ratelimit: upstream's compose files and
	// manifests run it. It must be a link to the binary, made in the build
	// stage in a directory copied to /bin/.
	if !upstreamCommand(build.Body, links["/bin/"], copied) {
		p.addf("Dockerfile: no /bin/ratelimit linked to %s: upstream's manifests run /bin/ratelimit", copied)
	}
	// The command sets no flag: a flag would win over upstream's variables
	// (RUNTIME_ROOT, ...), which the image must leave in charge. The image's
	// own defaults are SHARELIMIT_* variables.
	if len(cmd) != 1 || cmd[0] != "serve" {
		p.addf("Dockerfile: CMD %v; want [\"serve\"] alone: a flag would override upstream's variables", cmd)
	}
	// A VOLUME the image's user can write: the state file lives there, and a
	// volume outlives the container.
	for v := range volumes {
		if owned[v] != user {
			p.addf("Dockerfile: VOLUME %s is not copied in owned by USER %s: the daemon could not write its state there", v, user)
		}
	}
	checkDaemon(p, daemon{where: "Dockerfile: CMD", args: cmd, env: env, stateDirs: volumes,
		mounts: map[string]string{"/etc/sharelimit/config": filepath.Join(repo, "examples", "config")}})
}

// upstreamCommand reports whether the build stage links dir+"ratelimit" to
// target: RUN ... ln -s TARGET DIR/ratelimit.
func upstreamCommand(body []dockerfile.Instruction, dir, target string) bool {
	if dir == "" || target == "" {
		return false
	}
	for _, in := range body {
		if in.Cmd == "RUN" && strings.Contains(in.Args, "ln -s "+target+" "+dir+"ratelimit") {
			return true
		}
	}
	return false
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
