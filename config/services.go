package config

import (
	"fmt"
	"strings"
	"time"
)

// MaxServices is the most Consul services one daemon watches:
// --consul-service and the distinct services of --domain-service together.
// Each costs one blocking-query loop and one engine weight group.
const MaxServices = 64

// DomainService maps a domain to the Consul service whose replicas share its
// limits (--domain-service DOMAIN=SERVICE).
type DomainService struct {
	Domain, Service string
}

// domainServices is the --domain-service flag: repeatable, and each value may
// hold several comma-separated mappings, as SHARELIMIT_DOMAIN_SERVICE does.
// Set only splits; Validate judges the entries, so that every bad one is
// reported together with the others.
type domainServices struct{ m *[]DomainService }

func (d domainServices) String() string {
	if d.m == nil {
		return ""
	}
	parts := make([]string, len(*d.m))
	for i, m := range *d.m {
		parts[i] = m.Domain + "=" + m.Service
	}
	return strings.Join(parts, ",")
}

func (d domainServices) Set(v string) error {
	for _, entry := range strings.Split(v, ",") {
		if strings.TrimSpace(entry) == "" {
			continue
		}
		dom, svc, ok := strings.Cut(entry, "=")
		if !ok {
			return fmt.Errorf("want DOMAIN=SERVICE, got %q", entry)
		}
		*d.m = append(*d.m, DomainService{Domain: strings.TrimSpace(dom), Service: strings.TrimSpace(svc)})
	}
	return nil
}

// Services returns the Consul services the daemon watches: --consul-service
// first when set, then each service --domain-service names, in the order
// first named, each once.
func (c *Config) Services() []string {
	var out []string
	seen := map[string]bool{}
	add := func(s string) {
		if s != "" && !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	add(c.ConsulService)
	for _, m := range c.DomainServices {
		add(m.Service)
	}
	return out
}

// validateServices reports what is wrong with --domain-service and
// --membership-hold.
func (c *Config) validateServices(bad func(flag, format string, args ...any)) {
	domains := map[string]string{}
	for _, m := range c.DomainServices {
		switch {
		case m.Domain == "":
			bad("domain-service", "%q has an empty domain", m.Domain+"="+m.Service)
			continue
		case m.Service == "":
			bad("domain-service", "%q has an empty service", m.Domain+"="+m.Service)
			continue
		}
		if prev, ok := domains[m.Domain]; ok {
			bad("domain-service", "domain %q is mapped twice (to %s and to %s)", m.Domain, prev, m.Service)
			continue
		}
		domains[m.Domain] = m.Service
	}
	if n := len(c.Services()); n > MaxServices {
		bad("domain-service", "%d Consul services, --consul-service included; at most %d", n, MaxServices)
	}
	if c.MembershipHold < 0 || c.MembershipHold > maxHold {
		bad("membership-hold", "must be between 0 (off) and %s, got %s", maxHold, c.MembershipHold)
	}
	if c.MembershipGrace < 0 || c.MembershipGrace > maxHold {
		bad("membership-grace", "must be between 0 (off) and %s, got %s", maxHold, c.MembershipGrace)
	}
	validateDemand(c, bad)
}

// validateDemand checks the demand-sharing settings.
func validateDemand(c *Config, bad func(flag, format string, args ...any)) {
	if c.ShareMode != ShareCluster && c.ShareMode != ShareDemand {
		bad("share-mode", "must be %s or %s, got %q", ShareCluster, ShareDemand, c.ShareMode)
	}
	if c.DemandInterval < MinDemandInterval || c.DemandInterval > MaxDemandInterval {
		bad("demand-interval", "must be between %s and %s, got %s", MinDemandInterval, MaxDemandInterval, c.DemandInterval)
	}
	if !(c.DemandMaxWrites >= 1) || c.DemandMaxWrites > 10000 {
		bad("demand-max-writes", "must be between 1 and 10000, got %v", c.DemandMaxWrites)
	}
	if c.DemandTopKeys < 0 || c.DemandTopKeys > MaxDemandTopKeys {
		bad("demand-top-keys", "must be between 0 and %d, got %d", MaxDemandTopKeys, c.DemandTopKeys)
	}
	p := c.DemandPrefix
	if p == "" || strings.HasPrefix(p, "/") || !strings.HasSuffix(p, "/") || strings.Contains(p, "//") || len(p) > 200 {
		bad("demand-prefix", "must be a Consul KV folder such as sharelimit/demand/ (no leading /, a trailing /, at most 200 bytes), got %q", p)
	}
}

// MaxDemandTopKeys bounds --demand-top-keys: a report carries up to twice
// this many values per per-value rule.
const MaxDemandTopKeys = 1024

// Bounds of --demand-interval: faster writes cost Consul more than they gain
// in convergence; slower ones leave shares stale for longer than the
// reports' own lifetime makes sense.
const (
	MinDemandInterval = 100 * time.Millisecond
	MaxDemandInterval = time.Minute
)

// maxHold bounds --membership-hold: a longer hold keeps a share tighter than
// it need be for longer, and past minutes it only hides a misconfiguration.
const maxHold = 10 * time.Minute
