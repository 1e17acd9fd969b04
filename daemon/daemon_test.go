package daemon

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"go.uber.org/goleak"

	"github.com/sharelimit/sharelimit/config"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var _ = errors.New // keep imports honest if cases change

func quietLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func testConfig(t *testing.T) *config.Config {
	t.Helper()
	cfg := config.Defaults()
	cfg.ConfigDir = t.TempDir()
	if err := os.WriteFile(filepath.Join(cfg.ConfigDir, "r.yaml"), []byte("domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.GRPCAddr, cfg.HTTPAddr = "127.0.0.1:0", "127.0.0.1:0"
	cfg.Drain, cfg.ShutdownTimeout = 0, 0
	return cfg
}

// TestNewFailingLeavesNothingRunning: a listener that cannot open fails New,
// and nothing New built keeps running (goleak checks at the end of the run).
func TestNewFailingLeavesNothingRunning(t *testing.T) {
	for _, tc := range []struct{ name, grpc, http string }{
		{"admin address unusable", "127.0.0.1:0", "256.0.0.1:1"},
		{"gRPC address unusable", "256.0.0.1:1", "127.0.0.1:0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.GRPCAddr, cfg.HTTPAddr = tc.grpc, tc.http
			before := goleak.IgnoreCurrent()
			if _, err := New(cfg, quietLog(), "test"); err == nil {
				t.Fatal("New succeeded on an unusable address")
			}
			if err := goleak.Find(before); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestStopBeforeServeIsClean: a stop that begins before the gRPC server has
// started serving (a signal right after start) is a clean stop, not an error.
func TestStopBeforeServeIsClean(t *testing.T) {
	for range 20 {
		d, err := New(testConfig(t), quietLog(), "test")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := d.Run(ctx, nil); err != nil {
			t.Fatalf("Run after an immediate stop: %v", err)
		}
	}
}

// TestInvalidConfigIsErrConfig: an invalid config at start-up is ErrConfig,
// with every positioned error inside.
func TestInvalidConfigIsErrConfig(t *testing.T) {
	cfg := testConfig(t)
	if err := os.WriteFile(filepath.Join(cfg.ConfigDir, "bad.yaml"), []byte("domain: x\ndescriptors:\n  - key: \n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := New(cfg, quietLog(), "test")
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("err = %v, want ErrConfig", err)
	}
}
