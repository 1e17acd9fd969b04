package config

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestDemandDefaults(t *testing.T) {
	t.Parallel()
	c, err := Parse("serve", []string{"--config-dir", t.TempDir()}, env(nil), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.ShareMode != ShareCluster || c.DemandPrefix != "sharelimit/demand/" || c.DemandInterval != time.Second || c.DemandMaxWrites != 100 || c.DemandTopKeys != 64 {
		t.Errorf("defaults: mode %q prefix %q interval %s max writes %v top keys %d", c.ShareMode, c.DemandPrefix, c.DemandInterval, c.DemandMaxWrites, c.DemandTopKeys)
	}
	c, err = Parse("serve", []string{"--config-dir", t.TempDir()}, env(map[string]string{
		"SHARELIMIT_SHARE_MODE": "demand", "SHARELIMIT_DEMAND_INTERVAL": "0.5", "SHARELIMIT_DEMAND_PREFIX": "x/y/", "SHARELIMIT_DEMAND_MAX_WRITES": "20", "SHARELIMIT_DEMAND_TOP_KEYS": "8",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.ShareMode != ShareDemand || c.DemandPrefix != "x/y/" || c.DemandInterval != 500*time.Millisecond || c.DemandMaxWrites != 20 || c.DemandTopKeys != 8 {
		t.Errorf("from the environment: mode %q prefix %q interval %s max writes %v top keys %d", c.ShareMode, c.DemandPrefix, c.DemandInterval, c.DemandMaxWrites, c.DemandTopKeys)
	}
}

func TestDemandErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--share-mode", "replica"}, `--share-mode: must be cluster or demand, got "replica"`},
		{[]string{"--demand-interval", "50ms"}, "--demand-interval: must be between 100ms and 1m0s, got 50ms"},
		{[]string{"--demand-interval", "2m"}, "--demand-interval: must be between"},
		{[]string{"--demand-max-writes", "0"}, "--demand-max-writes: must be between 1 and 10000, got 0"},
		{[]string{"--demand-max-writes", "NaN"}, "--demand-max-writes: must be between 1 and 10000"},
		{[]string{"--demand-top-keys", "-1"}, "--demand-top-keys: must be between 0 and 1024, got -1"},
		{[]string{"--demand-top-keys", "1025"}, "--demand-top-keys: must be between 0 and 1024, got 1025"},
		{[]string{"--demand-prefix", "/abs/"}, "--demand-prefix: must be a Consul KV folder"},
		{[]string{"--demand-prefix", "no-slash"}, "--demand-prefix: must be a Consul KV folder"},
		{[]string{"--demand-prefix", "a//b/"}, "--demand-prefix: must be a Consul KV folder"},
		{[]string{"--demand-prefix", ""}, "--demand-prefix: must be a Consul KV folder"},
	} {
		c, err := Parse("serve", append([]string{"--config-dir", dir}, tc.args...), env(nil), io.Discard)
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %q", tc.args, err, tc.want)
		}
	}
}
