package daemon

import (
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/config"
)

// With --rlqs, the demand leader keeps the division in force for --rlqs-ttl
// after a replica leaves, as long as its Envoys may enforce its share.
func TestDepartedHoldIsTheRLQSTTL(t *testing.T) {
	for _, tc := range []struct {
		rlqs bool
		ttl  time.Duration
		want time.Duration
	}{
		{false, 15 * time.Second, 0},
		{true, 15 * time.Second, 15 * time.Second},
		{true, 40 * time.Second, 40 * time.Second},
	} {
		cfg := &config.Config{RLQS: tc.rlqs, RLQSTTL: tc.ttl, MembershipHold: time.Second}
		if got := departedHold(cfg); got != tc.want {
			t.Errorf("--rlqs=%v --rlqs-ttl %s: %s, want %s", tc.rlqs, tc.ttl, got, tc.want)
		}
	}
}
