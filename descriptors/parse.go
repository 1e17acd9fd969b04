package descriptors

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
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

// Errors returns every *Error inside err (as joined by Parse and Load), in order.
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

// Caps on what a config may contain. They exist so that no file, however
// written, can make the parser or the matcher do unbounded work.
const (
	MaxDepth     = 32      // nesting of descriptors
	MaxRules     = 100_000 // descriptors in one file
	MaxFileBytes = 16 << 20
)

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

var yamlLine = regexp.MustCompile(`line (\d+)`)

// Parse reads one descriptor file: one domain and its rules. name is used in
// positions. Every problem in the file is reported, joined, as *Error values.
func Parse(name string, r io.Reader) (*Set, error) {
	d, err := parseDomain(name, r)
	if err != nil {
		return nil, err
	}
	return assemble([]*Domain{d}, []string{name})
}

func parseDomain(name string, r io.Reader) (*Domain, error) {
	p := &parser{file: name}
	data, err := io.ReadAll(io.LimitReader(r, MaxFileBytes+1))
	if err != nil {
		return nil, &Error{Pos: Pos{name, 1, 1}, Msg: fmt.Sprintf("read: %v", err)}
	}
	if len(data) > MaxFileBytes {
		return nil, &Error{Pos: Pos{name, 1, 1}, Msg: fmt.Sprintf("file is larger than %d bytes", MaxFileBytes)}
	}
	dec := yaml.NewDecoder(strings.NewReader(string(data)))
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
	d := p.domain(root)
	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return d, nil
}

// yamlError gives a syntax error the position yaml.v3 knows: the line, and column 1.
func yamlError(name string, err error) error {
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

// fields walks a mapping, checking that keys are strings and known. It calls fn
// for each known key with its value node.
func (p *parser) fields(n *yaml.Node, path string, known map[string]bool, fn func(key string, k, v *yaml.Node)) {
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
		if !known[k.Value] {
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

var domainKeys = map[string]bool{"domain": true, "descriptors": true}

func (p *parser) domain(n *yaml.Node) *Domain {
	d := &Domain{File: p.file}
	if n.Kind == yaml.ScalarNode && n.Tag == "!!null" {
		p.errorf(n, "", "empty file: want a domain and descriptors")
		return d
	}
	var domNode *yaml.Node
	// Read the domain first: rule paths start with it, wherever the key stands.
	if n.Kind == yaml.MappingNode {
		for i := 0; i+1 < len(n.Content); i += 2 {
			if k, v := n.Content[i], n.Content[i+1]; k.Value == "domain" && v.Kind == yaml.ScalarNode && v.Tag != "!!null" {
				d.Name = v.Value
			}
		}
	}
	p.fields(n, "", domainKeys, func(key string, k, v *yaml.Node) {
		switch key {
		case "domain":
			domNode = k
			d.Name = p.str(v, "domain")
		case "descriptors":
			d.root = p.descriptors(v, "descriptors", d.Name, nil, 1)
		}
	})
	if n.Kind == yaml.MappingNode && d.Name == "" {
		at := n
		if domNode != nil {
			at = domNode
		}
		p.errorf(at, "domain", "config file cannot have empty domain")
	}
	return d
}

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

func (p *parser) descriptors(v *yaml.Node, path, domain string, parent *Rule, depth int) level {
	l := level{byKey: map[string]*keyGroup{}}
	if v.Kind == yaml.ScalarNode && v.Tag == "!!null" {
		return l
	}
	if v.Kind != yaml.SequenceNode {
		p.errorf(v, path, "want a list of descriptors, got %s", kindName(v))
		return l
	}
	if depth > MaxDepth {
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
		r := p.descriptor(item, ipath, domain, parent, depth)
		if r == nil {
			continue
		}
		g := l.byKey[r.Key]
		if g == nil {
			g = &keyGroup{exact: map[string]*Rule{}}
			l.byKey[r.Key] = g
		}
		dup := false
		switch r.Kind {
		case Exact:
			dup = g.exact[r.Value] != nil
			g.exact[r.Value] = r
		case KeyOnly:
			dup = g.def != nil
			g.def = r
		case Wildcard:
			for _, w := range g.wild {
				dup = dup || w.Value == r.Value
			}
			if !dup {
				g.wild = append(g.wild, r)
			}
		}
		if dup {
			p.errorf(item, ipath, "duplicate descriptor composite key '%s'", r.Path)
			continue
		}
		l.order = append(l.order, r)
	}
	return l
}

var descriptorKeys = map[string]bool{
	"key": true, "value": true, "descriptors": true, "rate_limit": true,
	"shadow_mode": true, "detailed_metric": true, "value_to_metric": true,
	"share_threshold": true, "quota_mode": true, "metadata": true,
}

func (p *parser) descriptor(n *yaml.Node, path, domain string, parent *Rule, depth int) *Rule {
	r := &Rule{Domain: domain, Parent: parent, Depth: depth, Pos: Pos{p.file, n.Line, n.Column}}
	var keyNode, subNode, shareNode *yaml.Node
	ok := true
	p.fields(n, path, descriptorKeys, func(key string, k, v *yaml.Node) {
		fp := path + "." + key
		switch key {
		case "key":
			keyNode = k
			r.Key = p.str(v, fp)
		case "value":
			r.Value = p.str(v, fp)
		case "descriptors":
			subNode = v
		case "rate_limit":
			r.Limit = p.limit(v, fp)
			ok = ok && r.Limit != nil
		case "shadow_mode":
			r.ShadowMode = p.boolean(v, fp)
		case "detailed_metric":
			r.DetailedMetric = p.boolean(v, fp)
		case "value_to_metric":
			r.ValueToMetric = p.boolean(v, fp)
		case "share_threshold":
			shareNode = k
			r.ShareThreshold = p.boolean(v, fp)
		case "quota_mode":
			r.QuotaMode = p.boolean(v, fp)
		case "metadata":
			if v.Kind != yaml.MappingNode {
				p.errorf(v, fp, "want a map, got %s", kindName(v))
				return
			}
			var m map[string]any
			if err := v.Decode(&m); err != nil {
				p.errorf(v, fp, "%v", err)
				return
			}
			r.Metadata = m
		}
	})
	if r.Key == "" {
		at := n
		if keyNode != nil {
			at = keyNode
		}
		p.errorf(at, path, "descriptor has empty key")
		ok = false
	}
	switch {
	case r.Value == "":
		r.Kind = KeyOnly
	case strings.Contains(r.Value, "*"):
		r.Kind = Wildcard
	default:
		r.Kind = Exact
	}
	if r.ShareThreshold && r.Kind != Wildcard {
		p.errorf(shareNode, path+".share_threshold", "share_threshold can only be used with wildcard values (containing '*'), but found key '%s'", composite(r.Key, r.Value))
		ok = false
	}
	if r.Limit != nil {
		for i, name := range r.Limit.Replaces {
			if name == r.Limit.Name {
				p.errorf(n, fmt.Sprintf("%s.rate_limit.replaces[%d]", path, i), "replaces should not contain name of same descriptor")
				ok = false
			}
		}
	}
	prefix := domain
	if parent != nil {
		prefix = parent.Path
	}
	r.Path = prefix + "." + composite(r.Key, r.Value)
	var pvary []bool
	if parent != nil {
		pvary = parent.varying
	}
	r.varying = append(append([]bool(nil), pvary...), r.Kind == KeyOnly || (r.Kind == Wildcard && !r.ShareThreshold))
	if subNode != nil {
		r.children = p.descriptors(subNode, path+".descriptors", domain, r, depth+1)
	} else {
		r.children = level{byKey: map[string]*keyGroup{}}
	}
	if !ok {
		return nil
	}
	return r
}

func composite(key, value string) string {
	if value == "" {
		return key
	}
	return key + "_" + value
}

var limitKeys = map[string]bool{
	"unit": true, "requests_per_unit": true, "unlimited": true, "name": true, "replaces": true,
	"unit_multiplier": true, "burst": true, "policy": true, "max_wait": true,
}

func (p *parser) limit(n *yaml.Node, path string) *Limit {
	l := &Limit{}
	before := len(p.errs)
	var unitNode, rpuNode, unlimitedNode, multNode, burstNode, policyNode, waitNode *yaml.Node
	unitText, hasUnit, hasRPU := "", false, false
	p.fields(n, path, limitKeys, func(key string, k, v *yaml.Node) {
		fp := path + "." + key
		switch key {
		case "unit":
			unitNode, hasUnit = v, true
			unitText = p.str(v, fp)
		case "requests_per_unit":
			rpuNode = v
			if x, ok := p.uint(v, fp, 32); ok {
				l.RequestsPerUnit, hasRPU = uint32(x), true
			}
		case "unlimited":
			unlimitedNode = k
			l.Unlimited = p.boolean(v, fp)
		case "name":
			l.Name = p.str(v, fp)
		case "replaces":
			l.Replaces = p.replaces(v, fp)
		case "unit_multiplier":
			if x, ok := p.uint(v, fp, 32); ok {
				if x < 1 {
					p.errorf(v, fp, "must be at least 1")
				}
				l.UnitMultiplier = uint32(x)
				multNode = v
			}
		case "burst":
			burstNode = v
			if x, ok := p.uint(v, fp, 63); ok {
				if x < 1 {
					p.errorf(v, fp, "must be at least 1 (use requests_per_unit: 0 to block)")
				}
				l.Burst = x
			}
		case "policy":
			policyNode = v
			switch s := p.str(v, fp); strings.ToLower(s) {
			case "reject", "":
				l.Policy = Reject
			case "wait":
				l.Policy = Wait
			default:
				p.errorf(v, fp, "invalid policy '%s' (want reject or wait)", s)
			}
		case "max_wait":
			waitNode = v
			s := p.str(v, fp)
			d, err := time.ParseDuration(s)
			switch {
			case s == "":
			case err != nil:
				p.errorf(v, fp, "invalid duration '%s' (want e.g. 15ms)", s)
			case d <= 0:
				p.errorf(v, fp, "must be positive, got %s", s)
			default:
				l.MaxWait = d
			}
		}
	})
	if n.Kind != yaml.MappingNode {
		return nil
	}
	unit, validUnit := ParseUnit(unitText)
	switch {
	case l.Unlimited && hasUnit && validUnit:
		p.errorf(unitNode, path+".unit", "should not specify rate limit unit when unlimited")
	case l.Unlimited:
		for _, x := range []*yaml.Node{burstNode, policyNode, waitNode} {
			if x != nil {
				p.errorf(x, path, "burst, policy and max_wait have no meaning when unlimited")
				break
			}
		}
	case !validUnit:
		at := unitNode
		if at == nil {
			at = n
		}
		p.errorf(at, path+".unit", "invalid rate limit unit '%s'", unitText)
	case multNode != nil && !WindowOK(unit, l.UnitMultiplier):
		p.errorf(multNode, path+".unit_multiplier", "a window of %d %ss is longer than the %d-year maximum",
			l.UnitMultiplier, unit, MaxWindow/Year.Duration())
	}
	if !l.Unlimited && !hasRPU && rpuNode == nil {
		at := n
		if unlimitedNode != nil {
			at = unlimitedNode
		}
		p.errorf(at, path, "requests_per_unit is required (0 blocks every request; or set unlimited: true)")
	}
	if !l.Unlimited && hasRPU && l.RequestsPerUnit == 0 && burstNode != nil {
		p.errorf(burstNode, path+".burst", "a blocking limit (requests_per_unit: 0) takes no burst")
	}
	if l.Policy == Wait && l.MaxWait == 0 && waitNode == nil {
		p.errorf(policyNode, path+".policy", "policy wait needs max_wait (e.g. 15ms)")
	}
	if l.Policy != Wait && waitNode != nil {
		p.errorf(waitNode, path+".max_wait", "max_wait needs policy: wait")
	}
	if len(p.errs) > before {
		return nil
	}
	l.Unit = unit
	l.finish()
	return l
}

func (p *parser) replaces(v *yaml.Node, path string) []string {
	if v.Kind != yaml.SequenceNode {
		p.errorf(v, path, "want a list of {name: ...}, got %s", kindName(v))
		return nil
	}
	var out []string
	for i, item := range v.Content {
		ip := fmt.Sprintf("%s[%d]", path, i)
		if item.Kind != yaml.MappingNode {
			p.errorf(item, ip, "yaml file contains list of type other than map: %s", strings.TrimSpace(describe(item)))
			continue
		}
		name := ""
		p.fields(item, ip, map[string]bool{"name": true}, func(_ string, _, v *yaml.Node) {
			name = p.str(v, ip+".name")
		})
		if name == "" {
			p.errorf(item, ip, "should not have an empty replaces entry")
			continue
		}
		out = append(out, name)
	}
	return out
}

// LoadPaths loads files and directories (every *.yaml and *.yml directly inside,
// dotfiles ignored) into one Set. Every error in every file is reported.
func LoadPaths(paths ...string) (*Set, error) {
	var files []string
	var errs []error
	for _, path := range paths {
		fi, err := os.Stat(path)
		if err != nil {
			errs = append(errs, &Error{Pos: Pos{path, 0, 0}, Msg: fmt.Sprintf("stat: %v", unwrapPathErr(err))})
			continue
		}
		if !fi.IsDir() {
			files = append(files, path)
			continue
		}
		found, err := ListDir(path)
		if err != nil {
			errs = append(errs, &Error{Pos: Pos{path, 0, 0}, Msg: fmt.Sprintf("read dir: %v", unwrapPathErr(err))})
			continue
		}
		files = append(files, found...)
	}
	var domains []*Domain
	for _, f := range files {
		d, err := parseFile(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		domains = append(domains, d)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return assemble(domains, files)
}

func unwrapPathErr(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// ListDir returns the config files directly in dir, sorted: *.yaml and *.yml,
// without dotfiles (which also skips Kubernetes' ..data bookkeeping entries).
func ListDir(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, ".") {
			continue
		}
		ext := strings.ToLower(filepath.Ext(name))
		if ext != ".yaml" && ext != ".yml" {
			continue
		}
		full := filepath.Join(dir, name)
		fi, err := os.Stat(full) // follows the symlinks ConfigMaps are made of
		if err != nil || fi.IsDir() {
			continue
		}
		out = append(out, full)
	}
	sort.Strings(out)
	return out, nil
}

func parseFile(path string) (*Domain, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, &Error{Pos: Pos{path, 0, 0}, Msg: fmt.Sprintf("open: %v", unwrapPathErr(err))}
	}
	defer f.Close()
	return parseDomain(path, f)
}

// assemble joins domains into a Set, rejecting a domain defined twice.
func assemble(domains []*Domain, files []string) (*Set, error) {
	s := &Set{Domains: map[string]*Domain{}, Files: files}
	var errs []error
	for _, d := range domains {
		if prev, dup := s.Domains[d.Name]; dup {
			errs = append(errs, &Error{Pos: Pos{d.File, 1, 1}, Path: "domain",
				Msg: fmt.Sprintf("duplicate domain '%s' in config file (also in %s)", d.Name, prev.File)})
			continue
		}
		s.Domains[d.Name] = d
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	names := make([]string, 0, len(s.Domains))
	for n := range s.Domains {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool {
		return s.Domains[names[i]].File+"\x00"+names[i] < s.Domains[names[j]].File+"\x00"+names[j]
	})
	var add func(l *level)
	add = func(l *level) {
		for _, r := range l.order {
			r.ID = len(s.Rules)
			r.identity = r.Path + "\x00" + varyingSig(r)
			if r.Limit != nil {
				r.identity += "\x00" + r.Limit.identity()
				if len(r.Limit.Replaces) > 0 {
					s.hasReplaces = true
				}
			}
			s.Rules = append(s.Rules, r)
			add(&r.children)
		}
	}
	for _, n := range names {
		add(&s.Domains[n].root)
	}
	return s, nil
}

func varyingSig(r *Rule) string {
	b := make([]byte, len(r.varying))
	for i, v := range r.varying {
		b[i] = '0'
		if v {
			b[i] = '1'
		}
	}
	return string(b)
}
