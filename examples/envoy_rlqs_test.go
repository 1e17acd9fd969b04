package examples_test

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"testing"
	"time"

	xdscorev3 "github.com/cncf/xds/go/xds/core/v3"
	xdsmatcherv3 "github.com/cncf/xds/go/xds/type/matcher/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlqsfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/rate_limit_quota/v3"
	networkinputsv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/matching/common_inputs/network/v3"
	typematcherv3 "github.com/envoyproxy/go-control-plane/envoy/type/matcher/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/anypb"
)

const (
	rlqsFilterType     = "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaFilterConfig"
	bucketSettingsType = "type.googleapis.com/envoy.extensions.filters.http.rate_limit_quota.v3.RateLimitQuotaBucketSettings"
	// envoyReportInterval is the one interval Envoy reports at, whatever
	// reporting_interval says.
	envoyReportInterval = 5 * time.Second
)

// rlqsFilter is one rate_limit_quota filter of a parsed bootstrap.
type rlqsFilter struct {
	where string
	cfg   *rlqsfilterv3.RateLimitQuotaFilterConfig
}

// rlqsFilters finds the rate_limit_quota filters of every listener.
func rlqsFilters(p *problems, where string, ec *envoyConfig) []rlqsFilter {
	var out []rlqsFilter
	for _, l := range ec.listeners {
		for _, hf := range l.hcm.GetHttpFilters() {
			if hf.GetTypedConfig().GetTypeUrl() != rlqsFilterType {
				continue
			}
			var cfg rlqsfilterv3.RateLimitQuotaFilterConfig
			at := fmt.Sprintf("%s: listener %s: filter %s", where, l.name, hf.GetName())
			if err := hf.GetTypedConfig().UnmarshalTo(&cfg); err != nil {
				p.addf("%s: %v", at, err)
				continue
			}
			out = append(out, rlqsFilter{at, &cfg})
		}
	}
	return out
}

// checkEnvoyRLQS checks a bootstrap whose listeners enforce sharelimit's
// quotas with the rate_limit_quota filter: it reaches the sidecar over HTTP/2,
// every bucket id maps to a rule of the domain (checked with `sharelimit
// explain`), and nothing in it can open the cap (rlqs-research §7): DENY_ALL
// before the first assignment and after expiry, a catch-all in every matcher
// tree, and no custom value read where its input may have none.
func checkEnvoyRLQS(p *problems, where string, data []byte, want envoyWant) *envoyConfig {
	ec := parseEnvoy(p, where, data)
	if ec == nil {
		return nil
	}
	for _, l := range ec.listeners {
		checkRouteClusters(p, where, ec, l)
	}
	filters := rlqsFilters(p, where, ec)
	if len(filters) == 0 {
		p.addf("%s: no listener has the envoy.filters.http.rate_limit_quota filter", where)
	}
	for _, f := range filters {
		checkRLQSFilter(p, ec, f, want)
	}
	return ec
}

func checkRLQSFilter(p *problems, ec *envoyConfig, f rlqsFilter, want envoyWant) {
	name := f.cfg.GetRlqsServer().GetEnvoyGrpc().GetClusterName()
	c := ec.clusters[name]
	switch {
	case name == "":
		p.addf("%s: rlqs_server must use envoy_grpc with a cluster", f.where)
	case c == nil:
		p.addf("%s: rlqs_server cluster %q does not exist", f.where, name)
	default:
		if eps := ec.endpoints(name); len(eps) != 1 || eps[0] != want.grpcAddr {
			p.addf("%s: cluster %s points at %v, but sharelimit listens on --grpc-addr %s", f.where, name, eps, want.grpcAddr)
		}
		if !http2(c) {
			p.addf("%s: cluster %s must speak HTTP/2 (gRPC): set typed_extension_protocol_options %s explicit_http_config.http2_protocol_options", f.where, name, httpOptionsKey)
		}
	}
	if f.cfg.GetFilterEnabled() != nil || f.cfg.GetFilterEnforced() != nil || len(f.cfg.GetRequestHeadersToAddWhenNotEnforced()) > 0 {
		p.addf("%s: filter_enabled, filter_enforced and request_headers_to_add_when_not_enforced: Envoy does not implement them", f.where)
	}
	if f.cfg.GetBucketMatchers() == nil {
		p.addf("%s: no bucket_matchers", f.where)
		return
	}
	walkBucketMatcher(p, f.where+": bucket_matchers", f.cfg.GetBucketMatchers(), nil, func(at string, action *xdscorev3.TypedExtensionConfig, guards []*xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate) {
		checkBucket(p, at, f.cfg.GetDomain(), action, guards, want)
	})
}

// walkBucketMatcher calls fn for every action of a matcher tree, with the
// single predicates that must all have held to reach it (nil for a catch-all:
// on_no_match proves nothing about the request). Every tree must end in a
// catch-all: a request no matcher matches passes unreported.
func walkBucketMatcher(p *problems, at string, m *xdsmatcherv3.Matcher, guards []*xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate,
	fn func(string, *xdscorev3.TypedExtensionConfig, []*xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate)) {
	onMatch := func(at string, om *xdsmatcherv3.Matcher_OnMatch, guards []*xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate) {
		switch {
		case om.GetKeepMatching():
			p.addf("%s: keep_matching: Envoy treats such a match as a preview and enforces nothing for it", at)
		case om.GetAction() != nil:
			fn(at, om.GetAction(), guards)
		case om.GetMatcher() != nil:
			walkBucketMatcher(p, at+": matcher", om.GetMatcher(), guards, fn)
		}
	}
	for i, fm := range m.GetMatcherList().GetMatchers() {
		g := append(append([]*xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate{}, guards...), conjuncts(fm.GetPredicate())...)
		onMatch(fmt.Sprintf("%s: matchers[%d]", at, i), fm.GetOnMatch(), g)
	}
	if t := m.GetMatcherTree(); t != nil {
		maps := t.GetExactMatchMap().GetMap()
		if maps == nil {
			maps = t.GetPrefixMatchMap().GetMap()
		}
		keys := sortedKeys(maps)
		for _, k := range keys {
			// The tree's input had a value: k, or a string k prefixes.
			g := append(append([]*xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate{}, guards...), &xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate{
				Input: t.GetInput(), Matcher: &xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate_ValueMatch{ValueMatch: &xdsmatcherv3.StringMatcher{MatchPattern: &xdsmatcherv3.StringMatcher_Prefix{Prefix: k}}}})
			onMatch(fmt.Sprintf("%s: matcher_tree[%q]", at, k), maps[k], g)
		}
	}
	if m.GetOnNoMatch() == nil {
		p.addf("%s: no on_no_match: a request no matcher matches would pass unreported and unlimited", at)
		return
	}
	onMatch(at+": on_no_match", m.GetOnNoMatch(), nil)
}

// conjuncts are the single predicates that hold whenever p holds: p itself,
// or the members of an and_matcher. An or_matcher or not_matcher proves
// nothing about any one input.
func conjuncts(p *xdsmatcherv3.Matcher_MatcherList_Predicate) []*xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate {
	if sp := p.GetSinglePredicate(); sp != nil {
		return []*xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate{sp}
	}
	var out []*xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate
	for _, q := range p.GetAndMatcher().GetPredicate() {
		out = append(out, conjuncts(q)...)
	}
	return out
}

// requiresValue reports whether a string matcher can only match a non-empty
// value, so the input it reads certainly had one.
func requiresValue(m *xdsmatcherv3.StringMatcher) bool {
	switch {
	case m.GetExact() != "", m.GetPrefix() != "", m.GetSuffix() != "", m.GetContains() != "":
		return true
	case m.GetSafeRegex() != nil:
		re, err := regexp.Compile(`^(?:` + m.GetSafeRegex().GetRegex() + `)$`)
		return err == nil && !re.MatchString("")
	}
	return false
}

// guarded reports whether one of the guards proves input has a value.
func guarded(input *corev3.TypedExtensionConfig, guards []*xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate) bool {
	for _, g := range guards {
		if proto.Equal(g.GetInput().GetTypedConfig(), input.GetTypedConfig()) && requiresValue(g.GetValueMatch()) {
			return true
		}
	}
	return false
}

func checkBucket(p *problems, at, domain string, action *xdscorev3.TypedExtensionConfig, guards []*xdsmatcherv3.Matcher_MatcherList_Predicate_SinglePredicate, want envoyWant) {
	at += ": " + action.GetName()
	if action.GetTypedConfig().GetTypeUrl() != bucketSettingsType {
		p.addf("%s: the action is %s, not RateLimitQuotaBucketSettings", at, action.GetTypedConfig().GetTypeUrl())
		return
	}
	var bs rlqsfilterv3.RateLimitQuotaBucketSettings
	if err := action.GetTypedConfig().UnmarshalTo(&bs); err != nil {
		p.addf("%s: %v", at, err)
		return
	}
	if bs.GetNoAssignmentBehavior().GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		p.addf("%s: no_assignment_behavior must be fallback_rate_limit {blanket_rule: DENY_ALL}: Envoy's default admits everything until the first assignment, and a token_bucket there is not enforced", at)
	}
	exp := bs.GetExpiredAssignmentBehavior()
	if exp.GetFallbackRateLimit().GetBlanketRule() != typev3.RateLimitStrategy_DENY_ALL {
		p.addf("%s: expired_assignment_behavior must be fallback_rate_limit {blanket_rule: DENY_ALL}: without it, an assignment sharelimit stopped renewing falls back to the no-assignment default, and reuse_last_assignment is not implemented", at)
	}
	if d := exp.GetExpiredAssignmentBehaviorTimeout(); d == nil || d.GetNanos() != 0 || d.GetSeconds() < 1 {
		p.addf("%s: expired_assignment_behavior_timeout %v: want a whole number of seconds, at least 1 (Envoy reads whole seconds)", at, d.AsDuration())
	}
	if d := bs.GetReportingInterval().AsDuration(); d != envoyReportInterval {
		p.addf("%s: reporting_interval %v: Envoy reports every %v whatever it says; say %v", at, d, envoyReportInterval, envoyReportInterval)
	}
	var entries []string
	for _, key := range sortedKeys(bs.GetBucketIdBuilder().GetBucketIdBuilder()) {
		vb := bs.GetBucketIdBuilder().GetBucketIdBuilder()[key]
		if vb.GetCustomValue() == nil {
			entries = append(entries, key+"="+vb.GetStringValue())
			continue
		}
		if !guarded(vb.GetCustomValue(), guards) {
			what := "under no predicate that requires its input to have a value"
			if guards == nil {
				what = "in an on_no_match catch-all"
			}
			p.addf("%s: bucket id %s: custom_value %s is read %s: when it has none, Envoy lets the request through unreported", at, key, vb.GetCustomValue().GetName(), what)
		}
		sample, err := sampleInput(vb.GetCustomValue().GetTypedConfig())
		if err != nil {
			p.addf("%s: bucket id %s: %v", at, key, err)
			continue
		}
		entries = append(entries, key+"="+sample)
	}
	if len(entries) == 0 {
		p.addf("%s: an empty bucket id", at)
		return
	}
	checkBucketRule(p, at, domain, entries, want)
}

// sampleInput is a value a custom_value input yields, for explain: a key-only
// rule matches it as it would match any.
func sampleInput(a *anypb.Any) (string, error) {
	m, err := a.UnmarshalNew()
	if err != nil {
		return "", err
	}
	switch m.(type) {
	case *networkinputsv3.SourceIPInput:
		return "192.0.2.10", nil
	case *typematcherv3.HttpRequestHeaderMatchInput:
		return "sample", nil
	}
	return "", fmt.Errorf("custom_value %s: this guard does not know what value it yields; teach sampleInput", a.GetTypeUrl())
}

// checkBucketRule asks `sharelimit explain --bucket` which rule the bucket id
// maps to: it must map to one, and to one that is not DENY_ALL for good.
func checkBucketRule(p *problems, at, domain string, entries []string, want envoyWant) {
	args := append([]string{"explain", "--config-dir", want.configDir, "--domain", domain, "--replicas", fmt.Sprint(max(want.replicas, 1)), "--bucket"}, entries...)
	out, err := sharelimit(want.configDir, args...)
	switch {
	case err != nil:
		p.addf("%s: %v", at, err)
	case !strings.Contains(out, "matched as the descriptor"):
		p.addf("%s: the bucket id {%s} (domain %s) maps to no rule in %s:\n%s", at, strings.Join(entries, ", "), domain, want.configDir, out)
	case strings.Contains(out, "RLQS: DENY_ALL"):
		p.addf("%s: the bucket id {%s} (domain %s) maps to a rule that admits nothing:\n%s", at, strings.Join(entries, ", "), domain, out)
	}
}

// TestEnvoyRLQSBootstrap checks examples/envoy/envoy-rlqs.yaml against the
// daemon's default --grpc-addr and the example descriptors.
func TestEnvoyRLQSBootstrap(t *testing.T) {
	t.Parallel()
	var p problems
	defaults := checkDaemon(&p, daemon{where: "defaults", notDeployed: true, mounts: map[string]string{"/etc/sharelimit/config": repo + "/examples/config"}})
	if defaults == nil {
		p.report(t)
		return
	}
	const file = "examples/envoy/envoy-rlqs.yaml"
	ec := checkEnvoyRLQS(&p, file, readFile(t, file), envoyWant{grpcAddr: defaults.GRPCAddr, configDir: repo + "/examples/config", replicas: 3})
	if ec != nil {
		var names []string
		for _, f := range rlqsFilters(&p, file, ec) {
			names = append(names, f.cfg.GetDomain())
		}
		sort.Strings(names)
		if strings.Join(names, ",") != "edge,edge" {
			p.addf("%s: want two rate_limit_quota filters for domain edge (a client's bucket and the API's), got domains %v", file, names)
		}
		if l := ec.listener(10000); l == nil || l.addr != "0.0.0.0:10000" || !l.hcm.GetUseRemoteAddress().GetValue() {
			p.addf("%s: want the ingress listener on 0.0.0.0:10000 with use_remote_address, so source_ip is the peer's", file)
		}
		if l := ec.listener(10000); l != nil && l.rateLimit != nil {
			p.addf("%s: the listener also asks sharelimit per request (envoy.filters.http.ratelimit): that is envoy.yaml's way", file)
		}
	}
	p.report(t)
}
