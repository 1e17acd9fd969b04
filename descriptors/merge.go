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

// mergeInto replaces n's merge pairs with the pairs they bring in. Keys the
// map writes itself win; among merged maps, the first that has a key wins.
func (p *parser) mergeInto(n *yaml.Node, seen map[*yaml.Node]mergeState, depth int) {
	own := map[string]bool{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if k := n.Content[i]; !isMergeKey(k) && k.Kind == yaml.ScalarNode {
			own[k.Value] = true
		}
	}
	taken := map[string]bool{}
	out := make([]*yaml.Node, 0, len(n.Content))
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !isMergeKey(k) {
			out = append(out, k, v)
			continue
		}
		for _, src := range p.mergeSources(v, seen, depth) {
			for j := 0; j+1 < len(src.Content); j += 2 {
				mk := src.Content[j]
				if mk.Kind == yaml.ScalarNode && (own[mk.Value] || taken[mk.Value]) {
					continue
				}
				if mk.Kind == yaml.ScalarNode {
					taken[mk.Value] = true
				}
				out = append(out, mk, src.Content[j+1])
			}
		}
	}
	n.Content = out
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
