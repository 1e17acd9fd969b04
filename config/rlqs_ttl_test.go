package config

import (
	"io"
	"strings"
	"testing"
)

// --rlqs-ttl must outlast Envoy's 5 s report interval with slack: only the
// answer to a report renews an assignment.
func TestRLQSTTLAtLeastTwoReports(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		ttl string
		ok  bool
	}{{"5s", false}, {"9s", false}, {"10s", true}, {"15s", true}, {"1h", true}, {"61m", false}} {
		cfg, err := Parse("serve", []string{"--rlqs", "--rlqs-ttl", tc.ttl, "--config-dir", t.TempDir()}, func(string) string { return "" }, io.Discard)
		if err == nil {
			err = cfg.Validate()
		}
		if tc.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), "rlqs-ttl")) {
			t.Errorf("--rlqs-ttl %s: %v, want ok %v", tc.ttl, err, tc.ok)
		}
	}
}
