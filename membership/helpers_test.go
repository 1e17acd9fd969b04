package membership

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"go.uber.org/goleak"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newClient returns a client for the agent at addr that keeps no idle
// connections, so none outlives its test.
func newClient(t testing.TB, addr, token string) *api.Client {
	t.Helper()
	c, err := api.NewClient(&api.Config{
		Address:    addr,
		Scheme:     "http",
		Token:      token,
		HttpClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// logBuffer collects slog output from Run's goroutine for the test goroutine.
type logBuffer struct{ testutil.Buffer }

func (b *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(b, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// watch builds a Consul source and runs it until the test ends. Run's result
// is checked on the test goroutine, in cleanup: it must return nil, promptly.
func watch(t *testing.T, cfg ConsulConfig, client *api.Client) *Consul {
	t.Helper()
	c, err := NewConsul(cfg, client)
	if err != nil {
		t.Fatalf("NewConsul: %v", err)
	}
	run(t, c)
	return c
}

// run runs c until the test ends, as watch does, for a test that adjusts c
// between NewConsul and Run; or any other source.
func run(t *testing.T, c interface{ Run(context.Context) error }) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run returned %v after cancel, want nil", err)
			}
		case <-time.After(5 * time.Second):
			t.Errorf("Run still running 5 s after its context was cancelled")
		}
	})
}

// waitView polls View (of a source or a Damper) until cond holds, for up to
// 30 s, and returns the view that satisfied it.
func waitView(t *testing.T, c interface{ View() View }, cond func(View) bool, format string, args ...any) View {
	t.Helper()
	var v View
	testutil.Eventually(t, 30*time.Second, func() error {
		if v = c.View(); !cond(v) {
			return fmt.Errorf("waiting for %s; view is %+v", fmt.Sprintf(format, args...), v)
		}
		return nil
	})
	return v
}

// counts matches a view's Total and Local and checks that its Weight follows.
func counts(total, local int) func(View) bool {
	return func(v View) bool {
		w, err := Weight(local, total)
		return err == nil && v.Total == total && v.Local == local && math.Abs(v.Weight-w) < 1e-12
	}
}

// countListed is what the watch counts of one answer with no grace: the
// entries listed passing, weighed by weigh (nil: each 1).
func countListed(entries []*api.ServiceEntry, node string, weigh func(*api.ServiceEntry) int) tally {
	var r roster
	return r.observe(entries, node, time.Unix(0, 0), weigh)
}
