package descriptors

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// Error is one problem in a config file, with its position.
type Error struct {
	Pos  Pos
	Path string // where in the document, e.g. descriptors[0].rate_limit.unit
	Msg  string
}

func (e *Error) Error() string {
	if e.Path == "" {
		return fmt.Sprintf("%s: %s", e.Pos, e.Msg)
	}
	return fmt.Sprintf("%s: %s: %s", e.Pos, e.Path, e.Msg)
}

// Errors returns every *Error inside err (as joined by Compile), in order.
func Errors(err error) []*Error {
	var out []*Error
	var walk func(error)
	walk = func(err error) {
		if err == nil {
			return
		}
		var e *Error
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, x := range j.Unwrap() {
				walk(x)
			}
			return
		}
		if errors.As(err, &e) {
			out = append(out, e)
		}
	}
	walk(err)
	return out
}

// yamlError gives a syntax error the position yaml.v3 knows: the line, and
// column 1. yaml.v3 puts the line in the message ("yaml: line 3: ..."); it is
// moved into the position so the message reads like every other. Only failed
// loads come here, so compiling the pattern each time costs nothing that
// matters, and keeps the package free of globals.
func yamlError(name string, err error) error {
	yamlLine := regexp.MustCompile(`line (\d+)`)
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 1
	if m := yamlLine.FindStringSubmatch(msg); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil {
			line = n
		}
		msg = strings.TrimSpace(yamlLine.ReplaceAllString(msg, ""))
		msg = strings.TrimPrefix(msg, ": ")
	}
	return &Error{Pos: Pos{name, line, 1}, Msg: "yaml: " + msg}
}
