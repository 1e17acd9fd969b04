// Package dockerfile reads the repository's Dockerfile as far as its tests
// need: its stages and their instructions. Two tests read it, for different
// reasons: examples checks that the image is built and run as documented,
// and e2e runs the real binary with the image's own entrypoint, command and
// environment. They share this reader so that both see one Dockerfile.
//
// It is not a Dockerfile parser for any Dockerfile: no variable expansion,
// heredocs or escape directive, which this repository's Dockerfile does not
// use. Only tests import it: production code must never depend on it, and
// it must never guess at an instruction it cannot read (ExecForm and Env
// return an error instead).
package dockerfile

import (
	"encoding/json"
	"fmt"
	"strings"
)

// Instruction is one instruction, continuation lines joined.
type Instruction struct {
	Cmd  string // upper case: FROM, RUN, ...
	Args string
}

// Stage is one build stage: its FROM and what follows it.
type Stage struct {
	Base, Name string
	Body       []Instruction
}

// Parse splits a Dockerfile into stages. Comments (and parser directives,
// which are comments too) are dropped.
func Parse(data string) []Stage {
	var stages []Stage
	var cur strings.Builder
	flush := func() {
		line := strings.TrimSpace(cur.String())
		cur.Reset()
		if line == "" {
			return
		}
		cmd, args, _ := strings.Cut(line, " ")
		in := Instruction{Cmd: strings.ToUpper(cmd), Args: strings.TrimSpace(args)}
		if in.Cmd == "FROM" {
			f := strings.Fields(in.Args)
			s := Stage{}
			for len(f) > 0 && strings.HasPrefix(f[0], "--") {
				f = f[1:] // --platform=...
			}
			if len(f) > 0 {
				s.Base = f[0]
			}
			if len(f) == 3 && strings.EqualFold(f[1], "AS") {
				s.Name = f[2]
			}
			stages = append(stages, s)
			return
		}
		if len(stages) > 0 {
			stages[len(stages)-1].Body = append(stages[len(stages)-1].Body, in)
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

// ExecForm reads a JSON-array instruction (ENTRYPOINT, CMD).
func ExecForm(in Instruction) ([]string, error) {
	var v []string
	if err := json.Unmarshal([]byte(in.Args), &v); err != nil {
		return nil, fmt.Errorf("%s %s: not the exec (JSON array) form", in.Cmd, in.Args)
	}
	return v, nil
}

// Env reads an ENV instruction in its KEY=value form, values unquoted when
// double-quoted. The legacy "ENV KEY value" form is an error.
func Env(in Instruction) ([][2]string, error) {
	var out [][2]string
	for _, f := range strings.Fields(in.Args) {
		k, v, ok := strings.Cut(f, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("ENV %s: want KEY=value pairs", in.Args)
		}
		if len(v) >= 2 && v[0] == '"' && v[len(v)-1] == '"' {
			v = v[1 : len(v)-1]
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}

// Image is what the final stage gives a container: its entrypoint, its
// default command and its environment, in order.
type Image struct {
	Entrypoint, Cmd []string
	Env             [][2]string
}

// Final reads the last stage's ENTRYPOINT, CMD and ENV; the last of each
// wins, as in Docker, and ENV accumulates.
func Final(stages []Stage) (Image, error) {
	var img Image
	if len(stages) == 0 {
		return img, fmt.Errorf("no stage")
	}
	for _, in := range stages[len(stages)-1].Body {
		var err error
		switch in.Cmd {
		case "ENTRYPOINT":
			img.Entrypoint, err = ExecForm(in)
		case "CMD":
			img.Cmd, err = ExecForm(in)
		case "ENV":
			var kv [][2]string
			kv, err = Env(in)
			img.Env = append(img.Env, kv...)
		}
		if err != nil {
			return img, err
		}
	}
	return img, nil
}
