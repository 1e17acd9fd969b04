package xds

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"

	rlsconfv3 "github.com/envoyproxy/go-control-plane/ratelimit/config/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/structpb"
	"gopkg.in/yaml.v3"

	"github.com/sharelimit/sharelimit/descriptors"
)

// TypeURL is the xDS type of the resources the source subscribes to.
const TypeURL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"

// Fields of RateLimitDescriptor in upstream's proto that the generated types
// this build uses may lack (see the package comment).
const (
	fieldQuotaMode protowire.Number = 7
	fieldMetadata  protowire.Number = 8
)

// compile turns the resources of one response into a Set: every resource is
// rendered as a file and the files are compiled together, so a domain defined
// twice is refused as it is across files. Every problem is reported, joined.
func compile(resources []*anypb.Any, opts descriptors.CompileOptions) (*descriptors.Set, error) {
	files := make([]descriptors.File, 0, len(resources))
	var errs []error
	names := map[string]bool{}
	for i, res := range resources {
		f, err := fromAny(i, res)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if names[f.Name] {
			errs = append(errs, &descriptors.Error{Pos: descriptors.Pos{File: f.Name, Line: 1, Col: 1},
				Msg: fmt.Sprintf("resources[%d]: resource name given twice", i)})
			continue
		}
		names[f.Name] = true
		files = append(files, f)
	}
	set, err := descriptors.CompileWith(opts, files...)
	if len(errs) > 0 {
		return nil, errors.Join(append(errs, err)...)
	}
	return set, err
}

// fromAny unpacks resource i of a response and renders it. An unnamed
// resource is named by its index.
func fromAny(i int, res *anypb.Any) (descriptors.File, error) {
	name := fmt.Sprintf("xds:resources[%d]", i)
	fail := func(format string, args ...any) (descriptors.File, error) {
		return descriptors.File{}, &descriptors.Error{Pos: descriptors.Pos{File: name, Line: 1, Col: 1}, Msg: fmt.Sprintf(format, args...)}
	}
	if res.GetTypeUrl() != TypeURL {
		return fail("resource of type %q, want %q", res.GetTypeUrl(), TypeURL)
	}
	var c rlsconfv3.RateLimitConfig
	if err := proto.Unmarshal(res.GetValue(), &c); err != nil {
		return fail("unmarshal RateLimitConfig: %v", err)
	}
	if c.GetName() != "" {
		name = "xds:" + c.GetName()
	}
	return toFile(&c, name)
}

// ToFile renders one RateLimitConfig as the descriptor YAML document it
// stands for, named "xds:" + its name; descriptors.Compile reads it as it
// reads a file. Fields this build does not know make an error, as unknown
// keys in a file do. A descriptor tree deeper than descriptors.MaxDepth, or
// with more than descriptors.MaxRules descriptors, is rendered only as far as
// Compile needs to refuse it.
func ToFile(c *rlsconfv3.RateLimitConfig) (descriptors.File, error) {
	return toFile(c, "xds:"+c.GetName())
}

func toFile(c *rlsconfv3.RateLimitConfig, name string) (descriptors.File, error) {
	r := &renderer{file: name}
	doc := r.config(c)
	if len(r.errs) > 0 {
		return descriptors.File{}, errors.Join(r.errs...)
	}
	data, err := yaml.Marshal(doc)
	if err != nil {
		return descriptors.File{}, &descriptors.Error{Pos: descriptors.Pos{File: name, Line: 1, Col: 1}, Msg: fmt.Sprintf("render as YAML: %v", err)}
	}
	return descriptors.File{Name: name, Data: data}, nil
}

// renderer builds the YAML node tree of one resource, collecting the
// problems that stop it from standing for a file.
type renderer struct {
	file  string
	rules int // descriptors rendered, counted as the parser counts them
	errs  []error
}

func (r *renderer) errorf(path, format string, args ...any) {
	r.errs = append(r.errs, &descriptors.Error{Pos: descriptors.Pos{File: r.file, Line: 1, Col: 1}, Path: path, Msg: fmt.Sprintf(format, args...)})
}

func (r *renderer) config(c *rlsconfv3.RateLimitConfig) *yaml.Node {
	r.unknown(c.ProtoReflect(), "")
	m := mapping()
	put(m, "domain", str(c.GetDomain()))
	if ds := c.GetDescriptors(); len(ds) > 0 {
		put(m, "descriptors", r.descriptors(ds, "descriptors", 1))
	}
	return m
}

// descriptors renders a list of descriptors at depth (1 for the top level).
// Below descriptors.MaxDepth the parser refuses a list without reading it, and
// past descriptors.MaxRules it stops reading, so rendering stops there too:
// no resource, however large, makes a document larger than Compile reads.
func (r *renderer) descriptors(ds []*rlsconfv3.RateLimitDescriptor, path string, depth int) *yaml.Node {
	seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
	if depth > descriptors.MaxDepth {
		seq.Content = append(seq.Content, mapping())
		return seq
	}
	for i, d := range ds {
		if r.rules > descriptors.MaxRules {
			break
		}
		r.rules++
		seq.Content = append(seq.Content, r.descriptor(d, fmt.Sprintf("%s[%d]", path, i), depth))
	}
	return seq
}

func (r *renderer) descriptor(d *rlsconfv3.RateLimitDescriptor, path string, depth int) *yaml.Node {
	m := mapping()
	if d == nil {
		return m
	}
	quota, meta := r.newerFields(d.ProtoReflect(), path)
	put(m, "key", str(d.GetKey()))
	if v := d.GetValue(); v != "" {
		put(m, "value", str(v))
	}
	if l := d.GetRateLimit(); l != nil {
		put(m, "rate_limit", r.limit(l, path+".rate_limit"))
	}
	if d.GetShadowMode() {
		put(m, "shadow_mode", boolean(true))
	}
	if d.GetDetailedMetric() {
		put(m, "detailed_metric", boolean(true))
	}
	if quota {
		put(m, "quota_mode", boolean(true))
	}
	if meta != nil {
		put(m, "metadata", structNode(meta, 0))
	}
	if ds := d.GetDescriptors(); len(ds) > 0 {
		put(m, "descriptors", r.descriptors(ds, path+".descriptors", depth+1))
	}
	return m
}

func (r *renderer) limit(l *rlsconfv3.RateLimitPolicy, path string) *yaml.Node {
	r.unknown(l.ProtoReflect(), path)
	m := mapping()
	unit := l.GetUnit()
	if !l.GetUnlimited() || unit != rlsconfv3.RateLimitUnit_UNKNOWN {
		put(m, "unit", str(unitName(unit)))
	}
	if !l.GetUnlimited() || l.GetRequestsPerUnit() != 0 {
		put(m, "requests_per_unit", &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.FormatUint(uint64(l.GetRequestsPerUnit()), 10)})
	}
	if l.GetUnlimited() {
		put(m, "unlimited", boolean(true))
	}
	if n := l.GetName(); n != "" {
		put(m, "name", str(n))
	}
	if rs := l.GetReplaces(); len(rs) > 0 {
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for i, x := range rs {
			r.unknown(x.ProtoReflect(), fmt.Sprintf("%s.replaces[%d]", path, i))
			item := mapping()
			put(item, "name", str(x.GetName()))
			seq.Content = append(seq.Content, item)
		}
		put(m, "replaces", seq)
	}
	return m
}

// unitName is the YAML name of a unit. The proto's numbers are those of
// descriptors.Unit, so a unit this build's generated enum lacks (WEEK, MONTH,
// YEAR) still maps; UNKNOWN and numbers no unit has keep their proto name, for
// Compile to refuse as it refuses a bad unit in a file.
func unitName(u rlsconfv3.RateLimitUnit) string {
	if du := descriptors.Unit(u); du.Duration() > 0 {
		return du.String()
	}
	return u.String()
}

// unknown refuses the fields of m this build does not know.
func (r *renderer) unknown(m protoreflect.Message, path string) {
	if !m.IsValid() {
		return
	}
	b := m.GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			r.errorf(path, "unreadable unknown fields: %v", protowire.ParseError(n))
			return
		}
		b = b[n:]
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			r.errorf(path, "unreadable unknown field %d: %v", num, protowire.ParseError(n))
			return
		}
		b = b[n:]
		r.errorf(path, "unknown field %d", num)
	}
}

// newerFields reads quota_mode and metadata from a RateLimitDescriptor:
// through reflection when the generated type has them, else from its unknown
// fields, where protobuf keeps fields the type lacks. Any other unknown field
// is refused.
func (r *renderer) newerFields(m protoreflect.Message, path string) (quota bool, meta *structpb.Struct) {
	fields := m.Descriptor().Fields()
	if fd := fields.ByNumber(fieldQuotaMode); fd != nil && fd.Kind() == protoreflect.BoolKind {
		quota = m.Get(fd).Bool()
	}
	if fd := fields.ByNumber(fieldMetadata); fd != nil && fd.Message() != nil && fd.Message().FullName() == "google.protobuf.Struct" && m.Has(fd) {
		meta = asStruct(m.Get(fd).Message().Interface())
		if meta == nil {
			r.errorf(path+".metadata", "unreadable metadata")
		}
	}
	b := m.GetUnknown()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			r.errorf(path, "unreadable unknown fields: %v", protowire.ParseError(n))
			return quota, meta
		}
		b = b[n:]
		switch {
		case num == fieldQuotaMode && typ == protowire.VarintType:
			var v uint64
			v, n = protowire.ConsumeVarint(b)
			quota = v != 0 // proto3: the last value wins
		case num == fieldMetadata && typ == protowire.BytesType:
			var v []byte
			v, n = protowire.ConsumeBytes(b)
			if n < 0 {
				break
			}
			if meta == nil {
				meta = &structpb.Struct{}
			}
			// A message field given twice is merged, as protobuf reads it.
			if err := (proto.UnmarshalOptions{Merge: true}).Unmarshal(v, meta); err != nil {
				r.errorf(path+".metadata", "unmarshal metadata: %v", err)
			}
		default:
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n >= 0 {
				r.errorf(path, "unknown field %d", num)
			}
		}
		if n < 0 {
			r.errorf(path, "unreadable unknown field %d: %v", num, protowire.ParseError(n))
			return quota, meta
		}
		b = b[n:]
	}
	return quota, meta
}

// asStruct converts a google.protobuf.Struct of any Go type (generated or
// dynamic) to a *structpb.Struct, or nil.
func asStruct(m proto.Message) *structpb.Struct {
	if s, ok := m.(*structpb.Struct); ok {
		return s
	}
	b, err := proto.Marshal(m)
	if err != nil {
		return nil
	}
	s := &structpb.Struct{}
	if proto.Unmarshal(b, s) != nil {
		return nil
	}
	return s
}

// structNode renders a Struct as a YAML map, keys sorted. Past
// descriptors.MaxDepth a value is rendered as null: the parser refuses
// metadata that deep wherever it stands, without reading it.
func structNode(s *structpb.Struct, depth int) *yaml.Node {
	m := mapping()
	keys := make([]string, 0, len(s.GetFields()))
	for k := range s.GetFields() {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		put(m, k, valueNode(s.GetFields()[k], depth+1))
	}
	return m
}

func valueNode(v *structpb.Value, depth int) *yaml.Node {
	if depth > descriptors.MaxDepth {
		return null()
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		return str(k.StringValue)
	case *structpb.Value_BoolValue:
		return boolean(k.BoolValue)
	case *structpb.Value_NumberValue:
		return number(k.NumberValue)
	case *structpb.Value_StructValue:
		return structNode(k.StructValue, depth)
	case *structpb.Value_ListValue:
		seq := &yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq"}
		for _, x := range k.ListValue.GetValues() {
			seq.Content = append(seq.Content, valueNode(x, depth+1))
		}
		return seq
	}
	return null() // null_value, or no kind at all
}

// number renders a float as YAML spells it; NaN and the infinities are kept,
// for the parser to refuse as it refuses them in a file.
func number(f float64) *yaml.Node {
	var s string
	switch {
	case math.IsNaN(f):
		s = ".nan"
	case math.IsInf(f, 1):
		s = ".inf"
	case math.IsInf(f, -1):
		s = "-.inf"
	default:
		s = strconv.FormatFloat(f, 'g', -1, 64)
	}
	tag := "!!float"
	if !strings.ContainsAny(s, ".eEnN") {
		tag = "!!int" // a whole number reads as one; the parser takes either as a float
	}
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: s}
}

func mapping() *yaml.Node { return &yaml.Node{Kind: yaml.MappingNode, Tag: "!!map"} }

func put(m *yaml.Node, key string, v *yaml.Node) { m.Content = append(m.Content, str(key), v) }

// str is a string scalar. The encoder quotes it wherever it would otherwise
// read as something else (null, true, 10); anything beyond printable ASCII
// words is double-quoted here, a style that escapes every character, so the
// string reads back exactly as it was (a block scalar would fold a leading
// newline), and so is "<<", which as a map key is a merge to the parser.
func str(s string) *yaml.Node {
	n := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: s}
	if !plainSafe(s) {
		n.Style = yaml.DoubleQuotedStyle
	}
	return n
}

// plainSafe: s is non-empty printable ASCII without leading or trailing
// spaces, and not "<<".
func plainSafe(s string) bool {
	if s == "" || s == "<<" || s[0] == ' ' || s[len(s)-1] == ' ' {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

func boolean(b bool) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!bool", Value: strconv.FormatBool(b)}
}

func null() *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!null", Value: "null"} }
