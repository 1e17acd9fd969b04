package loadgen

import (
	"encoding/binary"
	"errors"
	"os"
	"testing"
	"time"
)

func TestParseStatCPU(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		line string
		want time.Duration
		err  error
	}{
		{
			name: "plain",
			line: "1234 (sharelimit) S 1 1234 1234 0 -1 4194560 1000 0 0 0 250 75 0 0 20 0 12 0 100 0 0",
			want: 325 * 10 * time.Millisecond,
		},
		{
			name: "command with spaces and parentheses",
			line: "99 (a) b (c)) R 1 99 99 0 -1 0 0 0 0 0 7 3 0 0 20 0 1 0 100 0 0\n",
			want: 10 * 10 * time.Millisecond,
		},
		{name: "no command", line: "1234 S 1 2 3", err: errStatFormat},
		{name: "truncated", line: "1 (x) S 1 2 3 4 5 6 7 8 9", err: errStatFormat},
		{name: "not a number", line: "1 (x) S 1 1 1 0 -1 0 0 0 0 0 x 3 0", err: errStatFormat},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseStatCPU([]byte(tc.line), 10*time.Millisecond)
			if !errors.Is(err, tc.err) || got != tc.want {
				t.Fatalf("parseStatCPU = %v, %v; want %v, %v", got, err, tc.want, tc.err)
			}
		})
	}
}

func TestProcCPU(t *testing.T) {
	t.Parallel()
	if _, err := procCPU(os.Getpid()); err != nil {
		t.Fatalf("procCPU(self): %v", err)
	}
	if _, err := procCPU(1 << 30); err == nil {
		t.Fatal("procCPU of a pid that cannot exist: no error")
	}
	if tick := clockTick(); tick <= 0 || tick > time.Second {
		t.Fatalf("clockTick = %v", tick)
	}
}

func TestAuxvValue(t *testing.T) {
	t.Parallel()
	vec := func(pairs ...uint64) []byte {
		b := make([]byte, 0, 8*len(pairs))
		for _, p := range pairs {
			b = binary.NativeEndian.AppendUint64(b, p)
		}
		return b
	}
	if got := auxvValue(vec(6, 4096, 17, 250, 0, 0), 17); got != 250 {
		t.Fatalf("auxvValue = %d, want 250", got)
	}
	if got := auxvValue(vec(6, 4096, 0, 0, 17, 250), 17); got != 0 {
		t.Fatalf("auxvValue past AT_NULL = %d, want 0", got)
	}
	if got := auxvValue(vec(6), 17); got != 0 {
		t.Fatalf("auxvValue of a truncated vector = %d, want 0", got)
	}
}
