package config

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDomainServiceParsing(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cases := []struct {
		name     string
		args     []string
		env      map[string]string
		want     []DomainService
		services []string
	}{
		{
			name: "repeated flag, order kept",
			args: []string{"--domain-service", "a=svc-a", "--domain-service", "b=svc-b", "--consul-service", "edge"},
			want: []DomainService{{"a", "svc-a"}, {"b", "svc-b"}}, services: []string{"edge", "svc-a", "svc-b"},
		},
		{
			name: "comma form in one flag, spaces trimmed",
			args: []string{"--domain-service", "a = svc-a, b=svc-b,,c=svc-a"},
			want: []DomainService{{"a", "svc-a"}, {"b", "svc-b"}, {"c", "svc-a"}}, services: []string{"svc-a", "svc-b"},
		},
		{
			name: "variable, comma-separated",
			env:  map[string]string{"SHARELIMIT_DOMAIN_SERVICE": "a=svc-a,b=edge", "SHARELIMIT_CONSUL_SERVICE": "edge"},
			want: []DomainService{{"a", "svc-a"}, {"b", "edge"}}, services: []string{"edge", "svc-a"},
		},
		{
			name: "the flag wins over the variable",
			args: []string{"--domain-service", "a=flag"},
			env:  map[string]string{"SHARELIMIT_DOMAIN_SERVICE": "a=env,b=env"},
			want: []DomainService{{"a", "flag"}}, services: []string{"flag"},
		},
		{
			name: "a service value may hold '='",
			args: []string{"--domain-service", "a=svc=x"},
			want: []DomainService{{"a", "svc=x"}}, services: []string{"svc=x"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := Parse("serve", append([]string{"--config-dir", dir}, tc.args...), env(tc.env), io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(c.DomainServices, tc.want) {
				t.Errorf("mappings %v, want %v", c.DomainServices, tc.want)
			}
			if got := c.Services(); !slices.Equal(got, tc.services) {
				t.Errorf("services %v, want %v", got, tc.services)
			}
		})
	}
}

func TestMembershipDefaults(t *testing.T) {
	t.Parallel()
	d := Defaults()
	if !d.ConsulWeights || !d.ConsulCache || d.MembershipHold != 2*time.Second || d.DomainServices != nil {
		t.Fatalf("defaults: weights %v cache %v hold %s mappings %v", d.ConsulWeights, d.ConsulCache, d.MembershipHold, d.DomainServices)
	}
	c, err := Parse("serve", []string{"--consul-weights=false", "--consul-cache=false", "--membership-hold", "0"}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.ConsulWeights || c.ConsulCache || c.MembershipHold != 0 {
		t.Fatalf("not turned off: %+v", c)
	}
}

func TestDomainServiceErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	many := func(n int) []string {
		var args []string
		for i := range n {
			args = append(args, "--domain-service", fmt.Sprintf("d%d=s%d", i, i))
		}
		return args
	}
	cases := []struct {
		name string
		args []string
		want string // "" = valid
	}{
		{"no '='", []string{"--domain-service", "a"}, `invalid value "a" for flag -domain-service: want DOMAIN=SERVICE`},
		{"empty domain", []string{"--domain-service", "=svc"}, `--domain-service: "=svc" has an empty domain`},
		{"empty service", []string{"--domain-service", "a="}, `--domain-service: "a=" has an empty service`},
		{"domain twice", []string{"--domain-service", "a=x,a=y"}, `--domain-service: domain "a" is mapped twice (to x and to y)`},
		{"domain twice, same service", []string{"--domain-service", "a=x", "--domain-service", "a=x"}, `domain "a" is mapped twice`},
		{"the cap", many(MaxServices), ""},
		{"the cap + 1", many(MaxServices + 1), fmt.Sprintf("--domain-service: %d Consul services, --consul-service included; at most %d", MaxServices+1, MaxServices)},
		{"the cap counts --consul-service", append(many(MaxServices), "--consul-service", "edge"), "at most 64"},
		{"--consul-service named again is no new service", append(many(MaxServices-1), "--consul-service", "edge", "--domain-service", "x=edge"), ""},
		{"hold negative", []string{"--membership-hold", "-1s"}, "--membership-hold: must be between 0 (off) and 10m0s"},
		{"hold too long", []string{"--membership-hold", "11m"}, "--membership-hold: must be between"},
		{"consul flags with only --domain-service", []string{"--domain-service", "a=x", "--node", "n1", "--consul-filter", "Service.Tags contains \"x\"", "--consul-datacenter", "dc2"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := Parse("serve", append([]string{"--config-dir", dir}, tc.args...), env(nil), io.Discard)
			if err == nil {
				err = c.Validate()
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
