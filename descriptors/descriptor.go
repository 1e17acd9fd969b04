package descriptors

import (
	"fmt"
	"math"
	"strings"

	"gopkg.in/yaml.v3"
)

func isDescriptorKey(k string) bool {
	switch k {
	case "key", "value", "descriptors", "rate_limit", "shadow_mode", "detailed_metric",
		"value_to_metric", "share_threshold", "quota_mode", "metadata":
		return true
	}
	return false
}

// ruleDraft is a descriptor being read: the rule, and the nodes that later
// checks point their errors at.
type ruleDraft struct {
	*Rule
	ok                         bool
	keyNode, subNode, shareKey *yaml.Node
}

func (p *parser) descriptor(n *yaml.Node, path, domain string, parent *Rule, depth int) *Rule {
	d := ruleDraft{Rule: &Rule{domain: domain, parent: parent, depth: depth, pos: Pos{p.file, n.Line, n.Column}}, ok: true}
	p.fields(n, path, isDescriptorKey, func(key string, k, v *yaml.Node) { p.descriptorField(&d, key, k, v, path+"."+key) })
	p.checkDescriptor(&d, n, path)
	r := d.Rule
	r.kind = kindOf(r.value)
	prefix := domain
	var pvary []bool
	if parent != nil {
		prefix, pvary = parent.path, parent.varying
	}
	r.path = prefix + "." + composite(r.key, r.value)
	r.varying = append(append([]bool(nil), pvary...), r.kind == KeyOnly || (r.kind == Wildcard && !r.shareThreshold))
	r.children = level{byKey: map[string]*keyGroup{}}
	if d.subNode != nil {
		r.children = p.descriptors(d.subNode, path+".descriptors", domain, r, depth+1)
	}
	if !d.ok {
		return nil
	}
	return r
}

func (p *parser) descriptorField(d *ruleDraft, key string, k, v *yaml.Node, fp string) {
	r := d.Rule
	switch key {
	case "key":
		d.keyNode, r.key = k, p.str(v, fp)
	case "value":
		r.value = p.str(v, fp)
	case "descriptors":
		d.subNode = v
	case "rate_limit":
		r.limit = p.limit(v, fp)
		d.ok = d.ok && r.limit != nil
	case "shadow_mode":
		r.shadowMode = p.boolean(v, fp)
	case "detailed_metric":
		r.detailedMetric = p.boolean(v, fp)
	case "value_to_metric":
		r.valueToMetric = p.boolean(v, fp)
	case "share_threshold":
		d.shareKey, r.shareThreshold = k, p.boolean(v, fp)
	case "quota_mode":
		r.quotaMode = p.boolean(v, fp)
	case "metadata":
		r.metadata = p.metadata(v, fp)
	}
}

// metadata reads a descriptor's metadata: any map, which upstream turns into a
// protobuf Struct for response dynamic metadata. It is kept as JSON's types
// (map[string]any, []any, string, float64, bool, nil), so that conversion
// cannot fail later: keys are their text, as upstream formats them; numbers
// are float64, as a Struct holds them; other scalars (timestamps, binary) are
// their text.
func (p *parser) metadata(v *yaml.Node, path string) map[string]any {
	if v.Kind != yaml.MappingNode {
		p.errorf(v, path, "want a map, got %s", kindName(v))
		return nil
	}
	m, _ := p.jsonValue(v, path, 0).(map[string]any)
	return m
}

func (p *parser) jsonValue(v *yaml.Node, path string, depth int) any {
	if v.Kind == yaml.AliasNode && v.Alias != nil {
		v = v.Alias
	}
	if depth > MaxDepth {
		p.errorf(v, path, "metadata nested deeper than %d levels", MaxDepth)
		return nil
	}
	switch v.Kind {
	case yaml.MappingNode:
		m := make(map[string]any, len(v.Content)/2)
		for i := 0; i+1 < len(v.Content); i += 2 {
			k := v.Content[i]
			if k.Kind != yaml.ScalarNode {
				p.errorf(k, path, "metadata key is %s, want a scalar", kindName(k))
				continue
			}
			m[k.Value] = p.jsonValue(v.Content[i+1], path+"."+k.Value, depth+1)
		}
		return m
	case yaml.SequenceNode:
		l := make([]any, len(v.Content))
		for i, c := range v.Content {
			l[i] = p.jsonValue(c, fmt.Sprintf("%s[%d]", path, i), depth+1)
		}
		return l
	case yaml.ScalarNode:
		switch v.Tag {
		case "!!null":
			return nil
		case "!!bool":
			return p.boolean(v, path)
		case "!!int", "!!float":
			var f float64
			if err := v.Decode(&f); err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
				p.errorf(v, path, "metadata number %s is not a finite number", v.Value)
				return nil
			}
			return f
		}
		return v.Value
	}
	p.errorf(v, path, "unreadable metadata")
	return nil
}

// checkDescriptor holds the rules that span fields: a key is required, and
// share_threshold needs a wildcard. (That a limit cannot replace itself is
// checked with the limit, where the replaces entries' positions are known.)
func (p *parser) checkDescriptor(d *ruleDraft, n *yaml.Node, path string) {
	r := d.Rule
	if r.key == "" {
		p.errorf(firstOf(d.keyNode, n), path, "descriptor has empty key")
		d.ok = false
	}
	if r.shareThreshold && kindOf(r.value) != Wildcard {
		p.errorf(d.shareKey, path+".share_threshold", "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", composite(r.key, r.value))
		d.ok = false
	}
}

func kindOf(value string) MatchKind {
	switch {
	case value == "":
		return KeyOnly
	case strings.Contains(value, "*"):
		return Wildcard
	}
	return Exact
}
