package descriptors

import (
	"errors"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// The small steps every field goes through: walk a map's keys, read a string,
// a boolean or a whole number, and name a node in an error.

// fields walks a mapping, checking that keys are strings, known and given once.
// It calls fn for each known key with its value node, in the file's order, so
// errors come out in the order a reader meets them.
func (p *parser) fields(n *yaml.Node, path string, known func(string) bool, fn func(key string, k, v *yaml.Node)) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		p.errorf(n, path, "want a map, got %s", kindName(n))
		return
	}
	seen := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind != yaml.ScalarNode || (k.Tag != "!!str" && k.Tag != "") {
			p.errorf(k, path, "key is not a string: %s", strings.TrimSpace(describe(k)))
			continue
		}
		if !known(k.Value) {
			p.errorf(k, path, "unknown key '%s'%s", k.Value, hint(k.Value, path))
			continue
		}
		if seen[k.Value] {
			p.errorf(k, path, "key '%s' given twice", k.Value)
			continue
		}
		seen[k.Value] = true
		if v.Kind == yaml.AliasNode {
			v = v.Alias
		}
		fn(k.Value, k, v)
	}
}

// hint explains the mistakes operators make most.
func hint(key, path string) string {
	switch {
	case (key == "unit" || key == "requests_per_unit") && !strings.HasSuffix(path, "rate_limit"):
		return " (it belongs inside rate_limit)"
	case key == "rate_limit" && strings.HasSuffix(path, "rate_limit"):
		return " (rate_limit nested in rate_limit)"
	}
	return ""
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.ScalarNode:
		if n.Tag == "!!null" {
			return "null"
		}
		return "a scalar"
	case yaml.SequenceNode:
		return "a list"
	case yaml.MappingNode:
		return "a map"
	}
	return "nothing"
}

func describe(n *yaml.Node) string {
	if n.Kind == yaml.ScalarNode {
		return n.Value
	}
	return kindName(n)
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.Tag == "!!null" }

func (p *parser) str(v *yaml.Node, path string) string {
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" {
		p.errorf(v, path, "want a string, got %s", kindName(v))
		return ""
	}
	return v.Value
}

func (p *parser) boolean(v *yaml.Node, path string) bool {
	if v.Kind == yaml.ScalarNode {
		switch strings.ToLower(v.Value) {
		case "true", "yes", "on":
			return true
		case "false", "no", "off":
			return false
		}
	}
	p.errorf(v, path, "want true or false, got %s", strings.TrimSpace(describe(v)))
	return false
}

// uint reads an unsigned integer, also when written as a string (upstream's
// YAML is read by a library that accepts "10" for 10, and configs rely on it).
func (p *parser) uint(v *yaml.Node, path string, bits int) (uint64, bool) {
	if v.Kind != yaml.ScalarNode || v.Tag == "!!null" || v.Tag == "!!bool" {
		p.errorf(v, path, "want a whole number, got %s", strings.TrimSpace(describe(v)))
		return 0, false
	}
	s := strings.TrimSpace(v.Value)
	if strings.HasPrefix(s, "-") {
		p.errorf(v, path, "must not be negative, got %s", s)
		return 0, false
	}
	n, err := strconv.ParseUint(strings.ReplaceAll(strings.TrimPrefix(s, "+"), "_", ""), 10, bits)
	if err != nil {
		if errors.Is(err, strconv.ErrRange) {
			p.errorf(v, path, "%s is too large (at most %d)", s, uint64(1)<<bits-1)
		} else {
			p.errorf(v, path, "want a whole number, got %s", s)
		}
		return 0, false
	}
	return n, true
}
