package human

import "testing"

func TestNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		names []string
		want  string
	}{
		{"none", nil, ""},
		{"one", []string{"REDIS_URL"}, "REDIS_URL"},
		{"three, all shown", []string{"/bin/ratelimit", "REDIS_URL", "RUNTIME_ROOT"}, "/bin/ratelimit, REDIS_URL, RUNTIME_ROOT"},
		{"four: the last counted", []string{"A", "B", "C", "D"}, "A, B, C and 1 more"},
		{"many", []string{"A", "B", "C", "D", "E", "F"}, "A, B, C and 3 more"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			in := append([]string(nil), tc.names...)
			if got := Names(tc.names); got != tc.want {
				t.Errorf("Names(%q) = %q, want %q", tc.names, got, tc.want)
			}
			for i := range in {
				if in[i] != tc.names[i] {
					t.Fatalf("Names changed its argument: %q", tc.names)
				}
			}
		})
	}
}
