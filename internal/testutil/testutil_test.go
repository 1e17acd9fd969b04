package testutil

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestPollReportsTheLastError(t *testing.T) {
	t.Parallel()
	calls := 0
	err := Poll(20*time.Millisecond, func() error {
		calls++
		return errors.New("still " + strings.Repeat("x", calls))
	})
	if err == nil || !strings.Contains(err.Error(), "still "+strings.Repeat("x", calls)) {
		t.Fatalf("Poll = %v after %d calls, want the last call's error", err, calls)
	}
}

func TestPollStopsOnceTheConditionHolds(t *testing.T) {
	t.Parallel()
	calls := 0
	err := Poll(time.Minute, func() error {
		if calls++; calls < 3 {
			return errors.New("not yet")
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Poll = %v after %d calls, want nil after 3", err, calls)
	}
}

func TestFreeAddrNeverRepeats(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 50 {
		a := FreeAddr(t)
		if seen[a] {
			t.Fatalf("FreeAddr returned %s twice", a)
		}
		seen[a] = true
	}
}
