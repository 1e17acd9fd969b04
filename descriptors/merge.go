package descriptors

import (
	"gopkg.in/yaml.v3"
)

// YAML merge keys. Upstream decodes its files with yaml.v2, which resolves
// `<<: *anchor` while decoding, so configs written for it use merge keys to
// share rate_limit blocks. yaml.v3's node tree keeps `<<` as a key, so before
// a file is validated every merge is expanded in place: the merged map's pairs
// join the map that merges them, unless that map (or an earlier map in a
// merge list) already has the key, as the YAML merge type defines. The pairs
// keep their own nodes, so an error in a merged field points at the line where
// the user wrote it, under the anchor.

// mergeState marks a mapping node during expansion: being expanded (a merge
// that reaches it again is a cycle) or done.
type mergeState uint8

const (
	merging mergeState = iota + 1
	merged
)

// expandMerges resolves every merge key under n.
func (p *parser) expandMerges(n *yaml.Node) {
	p.expand(n, map[*yaml.Node]mergeState{}, 0)
}

func (p *parser) expand(n *yaml.Node, seen map[*yaml.Node]mergeState, depth int) {
	if n == nil || depth > 4*MaxDepth+8 {
		return
	}
	if n.Kind == yaml.AliasNode {
		n = n.Alias
		if n == nil {
			return
		}
	}
	switch n.Kind {
	case yaml.DocumentNode, yaml.SequenceNode:
		for _, c := range n.Content {
			p.expand(c, seen, depth+1)
		}
	case yaml.MappingNode:
		if seen[n] != 0 {
			return
		}
		seen[n] = merging
		for i := 1; i < len(n.Content); i += 2 {
			p.expand(n.Content[i], seen, depth+1)
		}
		if hasMerge(n) {
			p.mergeInto(n, seen, depth)
		}
		seen[n] = merged
	}
}

func isMergeKey(k *yaml.Node) bool {
	return k.Kind == yaml.ScalarNode && k.Tag == "!!merge"
}

func hasMerge(n *yaml.Node) bool {
	for i := 0; i+1 < len(n.Content); i += 2 {
		if isMergeKey(n.Content[i]) {
			return true
		}
	}
	return false
}

// mergeInto replaces n's merge pairs with the pairs they bring in, as
// upstream's YAML library (yaml.v2) decodes them: pairs apply in document
// order and a later one wins, so a merge overrides the keys written before
// it, and a key written after a merge overrides what it brought; within a
// list of merged maps the first wins. Where both values are maps and upstream
// decodes the field into a value that already exists (rate_limit, a pointer
// to a struct; metadata, a map), the later map's keys are laid over the
// earlier's rather than replacing it. A key written twice by the map itself
// stays twice, for fields to refuse.
func (p *parser) mergeInto(n *yaml.Node, seen map[*yaml.Node]mergeState, depth int) {
	out := make([]*yaml.Node, 0, len(n.Content))
	at := map[string]int{}       // scalar key -> index of its key node in out
	written := map[string]bool{} // the value at[key] is the map's own, not merged
	put := func(k, v *yaml.Node, merged bool) {
		if k.Kind != yaml.ScalarNode {
			out = append(out, k, v)
			return
		}
		i, ok := at[k.Value]
		switch {
		case !ok:
			at[k.Value] = len(out)
			out = append(out, k, v)
		case !merged && written[k.Value]:
			out = append(out, k, v)
			return
		default:
			out[i], out[i+1] = k, overlay(k.Value, out[i+1], v)
		}
		written[k.Value] = !merged
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !isMergeKey(k) {
			put(k, v, false)
			continue
		}
		srcs := p.mergeSources(v, seen, depth)
		for s := len(srcs) - 1; s >= 0; s-- {
			for j := 0; j+1 < len(srcs[s].Content); j += 2 {
				put(srcs[s].Content[j], srcs[s].Content[j+1], true)
			}
		}
	}
	n.Content = out
}

// overlay is the value of field key when next is decoded over prev: next,
// unless both are maps of a field upstream decodes into an existing value,
// which then get next's keys laid over prev's.
func overlay(key string, prev, next *yaml.Node) *yaml.Node {
	pm, nm := prev, next
	if pm.Kind == yaml.AliasNode && pm.Alias != nil {
		pm = pm.Alias
	}
	if nm.Kind == yaml.AliasNode && nm.Alias != nil {
		nm = nm.Alias
	}
	if (key != "rate_limit" && key != "metadata") || pm.Kind != yaml.MappingNode || nm.Kind != yaml.MappingNode {
		return next
	}
	m := &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map", Line: nm.Line, Column: nm.Column}
	m.Content = append(m.Content, pm.Content...)
	for j := 0; j+1 < len(nm.Content); j += 2 {
		k := nm.Content[j]
		replaced := false
		for i := 0; i+1 < len(m.Content); i += 2 {
			if k.Kind == yaml.ScalarNode && m.Content[i].Kind == yaml.ScalarNode && m.Content[i].Value == k.Value {
				m.Content[i], m.Content[i+1] = k, nm.Content[j+1]
				replaced = true
				break
			}
		}
		if !replaced {
			m.Content = append(m.Content, k, nm.Content[j+1])
		}
	}
	return m
}

// mergeSources returns the maps a merge value names: one map, or a list of
// maps, each usually an alias. They are expanded first, so merges chain.
func (p *parser) mergeSources(v *yaml.Node, seen map[*yaml.Node]mergeState, depth int) []*yaml.Node {
	one := func(x *yaml.Node) *yaml.Node {
		at := x
		if x.Kind == yaml.AliasNode && x.Alias != nil {
			x = x.Alias
		}
		if x.Kind != yaml.MappingNode {
			p.errorf(at, "", "a merge key (<<) takes a map or a list of maps, got %s", kindName(x))
			return nil
		}
		if seen[x] == merging {
			p.errorf(at, "", "a merge key (<<) merges a map into itself")
			return nil
		}
		p.expand(x, seen, depth+1)
		return x
	}
	val := v
	if val.Kind == yaml.AliasNode && val.Alias != nil {
		val = val.Alias
	}
	if val.Kind != yaml.SequenceNode {
		if m := one(v); m != nil {
			return []*yaml.Node{m}
		}
		return nil
	}
	var out []*yaml.Node
	for _, x := range val.Content {
		if m := one(x); m != nil {
			out = append(out, m)
		}
	}
	return out
}
