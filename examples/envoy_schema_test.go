package examples_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	hcmv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/network/http_connection_manager/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/known/anypb"
	"gopkg.in/yaml.v3"

	// Every type a typed_config in the examples names must be registered, or
	// protojson cannot resolve it. A config that names a type not imported
	// here fails with "unable to resolve": import its package.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ratelimit/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/router/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/upstreams/http/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
)

// envoyTypeMarker starts every Envoy type URL: a YAML document, code block or
// embedded string that holds one is Envoy configuration.
const envoyTypeMarker = "type.googleapis.com/envoy."

// validateEnvoyMessage runs m's generated validation, then that of every
// message packed in an Any inside it, at any depth. A message's ValidateAll
// checks an Any's presence only, never what it holds, so without the descent
// a typed_config that breaks its type's rules (a missing required field, an
// out-of-range value) would pass.
func validateEnvoyMessage(p *problems, where string, m proto.Message) {
	name := m.ProtoReflect().Descriptor().FullName()
	v, ok := m.(interface{ ValidateAll() error })
	switch {
	case !ok:
		p.addf("%s: %s has no generated validation: this check cannot vouch for it", where, name)
	default:
		if err := v.ValidateAll(); err != nil {
			p.addf("%s: %s: %v", where, name, err)
		}
	}
	eachAny(m.ProtoReflect(), "", func(at string, a *anypb.Any) {
		inner, err := a.UnmarshalNew()
		if err != nil {
			p.addf("%s: %s: %s: %v", where, at, a.GetTypeUrl(), err)
			return
		}
		validateEnvoyMessage(p, where+": "+at, inner)
	})
}

// eachAny calls fn for every Any set in m, with its path in m; it does not
// look inside the Anys.
func eachAny(m protoreflect.Message, at string, fn func(string, *anypb.Any)) {
	visit := func(at string, v protoreflect.Message) {
		if a, ok := v.Interface().(*anypb.Any); ok {
			fn(at, a)
			return
		}
		eachAny(v, at, fn)
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := at + string(fd.Name())
		switch {
		case fd.IsMap() && fd.MapValue().Message() != nil:
			v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
				visit(fmt.Sprintf("%s[%s].", name, k.String()), mv.Message())
				return true
			})
		case fd.IsList() && fd.Message() != nil:
			for i := range v.List().Len() {
				visit(fmt.Sprintf("%s[%d].", name, i), v.List().Get(i).Message())
			}
		case fd.Message() != nil && !fd.IsMap():
			visit(name+".", v.Message())
		}
		return true
	})
}

// envoyJSON turns decoded YAML into the JSON protojson reads.
func envoyJSON(doc any) ([]byte, error) { return json.Marshal(doc) }

// envoyFragments says, for a top-level key of a configuration fragment (a
// README's excerpt of a bootstrap), which message holds that field and how to
// get the parsed elements back, so each can be validated on its own: the
// holder itself lacks its other required fields.
var envoyFragments = map[string]struct {
	holder   func() proto.Message
	elements func(proto.Message) []proto.Message
}{
	"http_filters": {
		func() proto.Message { return &hcmv3.HttpConnectionManager{} },
		func(m proto.Message) []proto.Message { return elems(m.(*hcmv3.HttpConnectionManager).GetHttpFilters()) },
	},
	"clusters": {
		func() proto.Message { return &bootstrapv3.Bootstrap_StaticResources{} },
		func(m proto.Message) []proto.Message {
			return elems(m.(*bootstrapv3.Bootstrap_StaticResources).GetClusters())
		},
	},
	"listeners": {
		func() proto.Message { return &bootstrapv3.Bootstrap_StaticResources{} },
		func(m proto.Message) []proto.Message {
			return elems(m.(*bootstrapv3.Bootstrap_StaticResources).GetListeners())
		},
	},
	"virtual_hosts": {
		func() proto.Message { return &routev3.RouteConfiguration{} },
		func(m proto.Message) []proto.Message { return elems(m.(*routev3.RouteConfiguration).GetVirtualHosts()) },
	},
	"routes": {
		func() proto.Message { return &routev3.VirtualHost{} },
		func(m proto.Message) []proto.Message { return elems(m.(*routev3.VirtualHost).GetRoutes()) },
	},
	"rate_limits": {
		func() proto.Message { return &routev3.RouteAction{} },
		func(m proto.Message) []proto.Message { return elems(m.(*routev3.RouteAction).GetRateLimits()) },
	},
}

func elems[M proto.Message](s []M) []proto.Message {
	out := make([]proto.Message, len(s))
	for i, m := range s {
		out[i] = m
	}
	return out
}

// isBootstrap reports whether a document is a whole bootstrap rather than a
// fragment: it has one of the fields only a bootstrap has at the top.
func isBootstrap(doc map[string]any) bool {
	for _, k := range []string{"static_resources", "dynamic_resources", "admin", "node", "layered_runtime"} {
		if _, ok := doc[k]; ok {
			return true
		}
	}
	return false
}

// checkEnvoySchema parses one Envoy document found in the repository, a
// bootstrap or a fragment, strictly (every field and type URL must exist) and
// validates it, typed configs included.
func checkEnvoySchema(p *problems, where string, doc map[string]any) {
	if isBootstrap(doc) {
		js, err := envoyJSON(doc)
		if err != nil {
			p.addf("%s: %v", where, err)
			return
		}
		var bs bootstrapv3.Bootstrap
		if err := protojson.Unmarshal(js, &bs); err != nil {
			p.addf("%s: not a valid Envoy v3 bootstrap: %v", where, err)
			return
		}
		validateEnvoyMessage(p, where, &bs)
		return
	}
	for _, key := range sortedKeys(doc) {
		f, ok := envoyFragments[key]
		if !ok {
			p.addf("%s: an Envoy fragment with the top-level key %q: teach envoyFragments which message holds it", where, key)
			continue
		}
		js, err := envoyJSON(map[string]any{key: doc[key]})
		if err != nil {
			p.addf("%s: %s: %v", where, key, err)
			continue
		}
		holder := f.holder()
		if err := protojson.Unmarshal(js, holder); err != nil {
			p.addf("%s: %s: not valid Envoy v3 configuration: %v", where, key, err)
			continue
		}
		for i, m := range f.elements(holder) {
			validateEnvoyMessage(p, fmt.Sprintf("%s: %s[%d]", where, key, i), m)
		}
	}
}

// envoyDoc is one piece of Envoy configuration found in the repository.
type envoyDoc struct {
	where string // the file, and where in it
	doc   map[string]any
}

// fence opens or closes a Markdown code block.
var fence = regexp.MustCompile("(?m)^[ \t]*```")

// findEnvoyDocs finds the Envoy configuration in one file: a YAML or JSON
// document (each of a multi-document file), a Markdown code block, or a
// string inside any of these that is itself such a document (a ConfigMap's
// data, for one). A piece that mentions an Envoy type URL but does not parse
// is a problem, not something to skip.
func findEnvoyDocs(p *problems, name string, data []byte) []envoyDoc {
	var out []envoyDoc
	switch filepath.Ext(name) {
	case ".md":
		parts := fence.Split(string(data), -1)
		for i := 1; i < len(parts); i += 2 { // the odd parts are inside fences
			body := parts[i]
			if nl := strings.IndexByte(body, '\n'); nl >= 0 {
				body = body[nl+1:] // the info string: yaml, sh, ...
			}
			out = append(out, envoyDocsIn(p, fmt.Sprintf("%s: code block %d", name, (i+1)/2), body)...)
		}
	case ".yaml", ".yml", ".json":
		out = envoyDocsIn(p, name, string(data))
	}
	return out
}

// envoyDocsIn decodes every YAML document in text and collects the Envoy ones.
func envoyDocsIn(p *problems, where, text string) []envoyDoc {
	var out []envoyDoc
	dec := yaml.NewDecoder(strings.NewReader(text))
	for n := 1; ; n++ {
		var doc any
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if strings.Contains(text, envoyTypeMarker) {
				p.addf("%s: names Envoy types but is not YAML: %v", where, err)
			}
			break
		}
		at := where
		if n > 1 {
			at = fmt.Sprintf("%s: document %d", where, n)
		}
		out = append(out, envoyDocsInValue(p, at, doc)...)
	}
	return out
}

// envoyDocsInValue collects the Envoy documents in a decoded value: the value
// itself when it is one, else those inside it, strings holding YAML included.
func envoyDocsInValue(p *problems, where string, v any) []envoyDoc {
	switch v := v.(type) {
	case map[string]any:
		_, static := v["static_resources"]
		_, dynamic := v["dynamic_resources"]
		if static || dynamic || mentions(v, envoyTypeMarker) {
			return []envoyDoc{{where, v}}
		}
		var out []envoyDoc
		for _, k := range sortedKeys(v) {
			out = append(out, envoyDocsInValue(p, where+": "+k, v[k])...)
		}
		return out
	case []any:
		var out []envoyDoc
		for i, e := range v {
			out = append(out, envoyDocsInValue(p, fmt.Sprintf("%s[%d]", where, i), e)...)
		}
		return out
	case string:
		if strings.Contains(v, "\n") && strings.Contains(v, envoyTypeMarker) {
			return envoyDocsIn(p, where, v)
		}
	}
	return nil
}

// mentions reports whether a decoded value holds a string that starts with s.
func mentions(v any, s string) bool {
	switch v := v.(type) {
	case map[string]any:
		for _, e := range v {
			if mentions(e, s) {
				return true
			}
		}
	case []any:
		for _, e := range v {
			if mentions(e, s) {
				return true
			}
		}
	case string:
		return strings.HasPrefix(v, s)
	}
	return false
}

// repositoryEnvoyDocs walks the repository for Envoy configuration: every
// YAML, JSON and Markdown file outside .git-like and testdata directories
// (testdata holds recorded or deliberately broken inputs, not examples).
func repositoryEnvoyDocs(t *testing.T, p *problems) []envoyDoc {
	t.Helper()
	var out []envoyDoc
	err := filepath.WalkDir(repo, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if path != repo && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "node_modules" || d.Name() == "vendor") {
				return filepath.SkipDir
			}
			return nil
		}
		switch filepath.Ext(path) {
		case ".yaml", ".yml", ".json", ".md":
		default:
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(repo, path)
		out = append(out, findEnvoyDocs(p, filepath.ToSlash(rel), data)...)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestEveryEnvoyConfigIsValid parses every piece of Envoy configuration in the
// repository (the example bootstraps, the Kubernetes ConfigMap's, the README's
// excerpts) with Envoy's own schema, typed configs included, and runs the
// API's validation rules on each, so that a misspelt type URL or field, or a
// value Envoy refuses, fails here rather than when Envoy loads it.
func TestEveryEnvoyConfigIsValid(t *testing.T) {
	t.Parallel()
	var p problems
	docs := repositoryEnvoyDocs(t, &p)
	found := map[string]bool{}
	for _, d := range docs {
		found[strings.SplitN(d.where, ":", 2)[0]] = true
		checkEnvoySchema(&p, d.where, d.doc)
	}
	// The walk must find what is known to be there, or it checks nothing.
	want, _ := filepath.Glob(filepath.Join(repo, "examples", "envoy", "*"))
	for i, w := range want {
		want[i], _ = filepath.Rel(repo, w)
	}
	want = append(want, "examples/kubernetes/envoy-configmap.yaml", "README.md")
	if len(want) < 4 {
		p.addf("examples/envoy holds %d files: the example bootstraps are not where this test looks", len(want)-2)
	}
	for _, w := range want {
		if !found[filepath.ToSlash(w)] {
			p.addf("%s: no Envoy configuration found in it: the search is broken, or the file no longer names an Envoy type", w)
		}
	}
	var where []string
	for _, d := range docs {
		where = append(where, d.where)
	}
	sort.Strings(where)
	t.Logf("checked %d pieces of Envoy configuration:\n%s", len(docs), strings.Join(where, "\n"))
	p.report(t)
}

// TestEnvoySchemaGuardCatches feeds the search and the schema check broken
// pieces in every form they look for, and each must be found and refused.
func TestEnvoySchemaGuardCatches(t *testing.T) {
	t.Parallel()
	bootstrap := readFile(t, "examples/envoy/envoy.yaml")
	indent := func(s string) string {
		var b bytes.Buffer
		for _, line := range strings.SplitAfter(s, "\n") {
			if line != "" {
				b.WriteString("    " + line)
			}
		}
		return b.String()
	}
	configMap := func(bs []byte) []byte {
		return []byte("apiVersion: v1\nkind: ConfigMap\nmetadata: { name: envoy }\ndata:\n  envoy.yaml: |\n" + indent(string(bs)))
	}
	markdown := func(block string) []byte { return []byte("# Envoy\n\n```yaml\n" + block + "```\n\ntext\n") }
	routerFragment := "http_filters:\n  - name: envoy.filters.http.router\n    typed_config:\n      \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n"
	for _, tc := range []struct {
		name, file string
		data       []byte
		want       string
	}{
		{"misspelt type URL in a ConfigMap's bootstrap", "cm.yaml",
			configMap(bytes.Replace(bootstrap, []byte("v3.Router\n"), []byte("v3.Routr\n"), 1)), "unable to resolve"},
		{"misspelt field in a ConfigMap's bootstrap", "cm.yaml",
			configMap(bytes.Replace(bootstrap, []byte("stat_prefix:"), []byte("stats_prefix:"), 1)), "unknown field"},
		{"nested value the API forbids", "envoy.yaml",
			bytes.Replace(bootstrap, []byte("explicit_http_config:\n            http2_protocol_options: {}"), []byte("explicit_http_config: {}"), 1), "ProtocolConfig"},
		{"misspelt type URL in a README excerpt", "README.md",
			markdown(strings.Replace(routerFragment, "v3.Router", "v3.Routers", 1)), "unable to resolve"},
		{"misspelt field in a README excerpt", "README.md",
			markdown(strings.Replace(routerFragment, "typed_config", "typed_conf", 1)), "unknown field"},
		{"README excerpt of an unknown part", "README.md",
			markdown("filter_chains:\n  - filters: [ { name: x, typed_config: { \"@type\": type.googleapis.com/envoy.x } } ]\n"), "teach envoyFragments"},
		{"README excerpt that is not YAML", "README.md",
			markdown("http_filters: [ \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router\n"), "not YAML"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var p problems
			docs := findEnvoyDocs(&p, tc.file, tc.data)
			for _, d := range docs {
				checkEnvoySchema(&p, d.where, d.doc)
			}
			expectProblem(t, p, tc.want)
		})
	}
}
