package descriptors

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"gopkg.in/yaml.v3"
)

// Caps on what a config may contain. They exist so that no file, however
// written, can make the parser or the matcher do unbounded work.
const (
	MaxDepth     = 32      // nesting of descriptors
	MaxRules     = 100_000 // descriptors in one file
	MaxFileBytes = 16 << 20
)

// File is one config file as a source read it: the name that positions in
// errors carry, and its bytes.
type File struct {
	Name string
	Data []byte
}

// Parse reads one descriptor file: one domain and its rules. name is used in
// positions. Every problem in the file is reported, joined, as *Error values.
func Parse(name string, r io.Reader) (*Set, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		return nil, &Error{Pos: Pos{name, 1, 1}, Msg: fmt.Sprintf("read: %v", err)}
	}
	return Compile(File{Name: name, Data: data})
}

// CompileOptions change how files join into one Set.
type CompileOptions struct {
	// MergeDomains joins files that name the same domain into one domain, as
	// upstream's MERGE_DOMAIN_CONFIG; a descriptor that two of them define is
	// still an error. Without it, a domain defined twice is an error.
	MergeDomains bool
}

// Compile parses every file, one domain each, and joins them into one Set.
// Every problem in every file is reported, joined, as *Error values; a
// domain defined twice is one of them.
func Compile(files ...File) (*Set, error) { return CompileWith(CompileOptions{}, files...) }

// CompileWith is Compile with options.
func CompileWith(opts CompileOptions, files ...File) (*Set, error) {
	var errs []error
	domains := make([]*Domain, 0, len(files))
	var names []string // nil for no files, as a set loaded from nothing has always said
	for _, f := range files {
		names = append(names, f.Name)
		d, err := parseDomain(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		domains = append(domains, d)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return assemble(domains, names, opts)
}

// parser collects the errors of one file.
type parser struct {
	file  string
	errs  []error
	rules int
}

func (p *parser) errorf(n *yaml.Node, path, format string, args ...any) {
	line, col := 1, 1
	if n != nil && n.Line > 0 {
		line, col = n.Line, n.Column
	}
	p.errs = append(p.errs, &Error{Pos: Pos{p.file, line, col}, Path: path, Msg: fmt.Sprintf(format, args...)})
}

func parseDomain(f File) (*Domain, error) {
	name := f.Name
	if len(f.Data) > MaxFileBytes {
		return nil, &Error{Pos: Pos{name, 1, 1}, Msg: fmt.Sprintf("file is larger than %d bytes", MaxFileBytes)}
	}
	dec := yaml.NewDecoder(strings.NewReader(string(f.Data)))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{Pos: Pos{name, 1, 1}, Msg: "empty file: want a domain and descriptors"}
		}
		return nil, yamlError(name, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); err == nil {
		return nil, &Error{Pos: Pos{name, extra.Line, extra.Column}, Msg: "more than one YAML document: one domain per file"}
	} else if !errors.Is(err, io.EOF) {
		return nil, yamlError(name, err)
	}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	p := &parser{file: name}
	if p.expandMerges(root); len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	d := p.domain(root)
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return d, nil
}

func isDomainKey(k string) bool { return k == "domain" || k == "descriptors" }

func (p *parser) domain(n *yaml.Node) *Domain {
	d := &Domain{file: p.file}
	if isNull(n) {
		p.errorf(n, "", "empty file: want a domain and descriptors")
		return d
	}
	// Read the domain first: rule paths start with it, wherever the key stands.
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k, v := n.Content[i], n.Content[i+1]; k.Value == "domain" && v.Kind == yaml.ScalarNode && !isNull(v) {
				d.name = v.Value
			}
		}
	}
	var domNode *yaml.Node
	p.fields(n, "", isDomainKey, func(key string, k, v *yaml.Node) {
		switch key {
		case "domain":
			domNode = k
			d.name = p.str(v, "domain")
			d.pos = Pos{p.file, k.Line, k.Column}
		case "descriptors":
			d.root = p.descriptors(v, "descriptors", d.name, nil, 1)
		}
	})
	if n.Kind == yaml.MappingNode && d.name == "" {
		p.errorf(firstOf(domNode, n), "domain", "config file cannot have empty domain")
	}
	return d
}

// firstOf returns the first node that is there: the most precise position
// known for an error.
func firstOf(nodes ...*yaml.Node) *yaml.Node {
	for _, n := range nodes {
		if n != nil {
			return n
		}
	}
	return nil
}

func (p *parser) descriptors(v *yaml.Node, path, domain string, parent *Rule, depth int) level {
	l := level{byKey: map[string]*keyGroup{}}
	switch {
	case isNull(v):
		return l
	case v.Kind != yaml.SequenceNode:
		p.errorf(v, path, "want a list of descriptors, got %s", kindName(v))
		return l
	case depth > MaxDepth:
		p.errorf(v, path, "descriptors nested deeper than %d levels", MaxDepth)
		return l
	}
	for i, item := range v.Content {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		if item.Kind == yaml.AliasNode {
			item = item.Alias
		}
		if item.Kind != yaml.MappingNode {
			p.errorf(item, ipath, "yaml file contains list of type other than map: %s", strings.TrimSpace(describe(item)))
			continue
		}
		if p.rules++; p.rules > MaxRules {
			p.errorf(item, ipath, "more than %d descriptors in one file", MaxRules)
			return l
		}
		if r := p.descriptor(item, ipath, domain, parent, depth); r != nil {
			if first := l.add(r); first != nil {
				p.errorf(item, ipath, "duplicate descriptor composite key '%s' (first at %d:%d)", r.path, first.pos.Line, first.pos.Col)
			}
		}
	}
	return l
}

// add puts r in the level, unless a rule with the same composite key is
// there: then it returns that rule.
func (l *level) add(r *Rule) (first *Rule) {
	// Upstream keys a level by the composite key_value string, so key "a_b"
	// and key "a" with value "b" are one descriptor to it; two rules there
	// would also share one stats path. Refuse them as upstream does.
	c := composite(r.key, r.value)
	if prev := l.composites[c]; prev != nil {
		return prev
	}
	if l.composites == nil {
		l.composites = map[string]*Rule{}
	}
	l.composites[c] = r
	g := l.byKey[r.key]
	if g == nil {
		g = &keyGroup{exact: map[string]*Rule{}}
		l.byKey[r.key] = g
	}
	switch r.kind {
	case Exact:
		g.exact[r.value] = r
	case KeyOnly:
		g.def = r
	case Wildcard:
		g.wild = append(g.wild, r)
	}
	l.order = append(l.order, r)
	return nil
}

func composite(key, value string) string {
	if value == "" {
		return key
	}
	return key + "_" + value
}
