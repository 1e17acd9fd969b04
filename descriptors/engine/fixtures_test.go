package engine

import (
	"strings"
	"testing"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// newEngine is New, failing t on an error.
func newEngine(t testing.TB, set *descriptors.Set, store *bucket.Store, opts Options) *Engine {
	t.Helper()
	e, err := New(set, store, opts)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// decide is Decide in the shape most tests want: the statuses and the overall
// code.
func decide(e *Engine, domain string, descs []*commonv3.RateLimitDescriptor, hits uint32, now int64, out []Status) ([]Status, rlsv3.RateLimitResponse_Code, error) {
	d := Decision{Statuses: out}
	err := e.Decide(&d, domain, descs, hits, now)
	return d.Statuses, d.Code, err
}

// mustParse compiles one YAML document, failing t on an error.
func mustParse(t testing.TB, yaml string) *descriptors.Set {
	t.Helper()
	set, err := descriptors.Parse("test.yaml", strings.NewReader(yaml))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// entries are a descriptor's entries, from "key=value" pairs.
func entries(kvs ...string) []*commonv3.RateLimitDescriptor_Entry {
	out := make([]*commonv3.RateLimitDescriptor_Entry, len(kvs))
	for i, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		out[i] = &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v}
	}
	return out
}

func descs(d ...*commonv3.RateLimitDescriptor) []*commonv3.RateLimitDescriptor { return d }

// compileFiles reads config files, and the *.yaml and *.yml files directly in
// directories, and compiles them: what the file source does, without
// importing it.
func compileFiles(t testing.TB, paths ...string) (*descriptors.Set, error) {
	t.Helper()
	return compileFilesWith(t, descriptors.CompileOptions{}, paths...)
}

func compileFilesWith(t testing.TB, opts descriptors.CompileOptions, paths ...string) (*descriptors.Set, error) {
	t.Helper()
	var files []descriptors.File
	for _, f := range testutil.ReadConfig(t, paths...) {
		files = append(files, descriptors.File{Name: f.Name, Data: f.Data})
	}
	return descriptors.CompileWith(opts, files...)
}
