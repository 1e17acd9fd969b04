package consulkv

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	Keys Keys
	// Rate is the most queries a second (pacing, as the membership watch);
	// Wait is how long one blocking query may wait (default 1 minute).
	Rate float64
	Wait time.Duration
	// MaxValue bounds the parameters: larger ones are ignored and counted.
	MaxValue int
	Logger   *slog.Logger
}

// WatcherStats are a watcher's counters.
type WatcherStats struct {
	Updates, Errors, Oversized uint64
	LastError                  string
}

// Watcher watches the parameters key with blocking queries and calls
// onParams with each new value (nil when the key is gone). While Consul is
// unreachable it calls nothing: the last value stands.
type Watcher struct {
	client   *api.Client
	cfg      WatcherConfig
	onParams func(value []byte, index uint64)
	log      *slog.Logger

	mu    sync.Mutex
	stats WatcherStats
}

// NewWatcher returns a watcher that Run runs.
func NewWatcher(client *api.Client, cfg WatcherConfig, onParams func(value []byte, index uint64)) (*Watcher, error) {
	if client == nil || onParams == nil {
		return nil, fmt.Errorf("consulkv watcher: nil client or callback")
	}
	if !(cfg.Rate > 0) {
		return nil, fmt.Errorf("consulkv watcher: rate %v", cfg.Rate)
	}
	if cfg.Wait <= 0 {
		cfg.Wait = time.Minute
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Watcher{client: client, cfg: cfg, onParams: onParams, log: log}, nil
}

// Stats returns the watcher's counters.
func (w *Watcher) Stats() WatcherStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stats
}

// Run watches until ctx ends.
func (w *Watcher) Run(ctx context.Context) error {
	var index uint64
	var last []byte
	seen := false
	errs := 0
	gap := time.Duration(float64(time.Second) / w.cfg.Rate)
	for {
		started := time.Now()
		pair, meta, err := w.client.KV().Get(w.cfg.Keys.Params(), (&api.QueryOptions{WaitIndex: index, WaitTime: w.cfg.Wait}).WithContext(ctx))
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			errs++
			w.mu.Lock()
			w.stats.Errors++
			w.stats.LastError = err.Error()
			w.mu.Unlock()
			w.log.Warn("demand parameters watch", "service", w.cfg.Keys.Service, "err", err)
			if !sleep(ctx.Done(), backoff(errs)) {
				return nil
			}
			continue
		}
		errs = 0
		// Consul's rules for the index: one that went backwards starts
		// over; 0 is never waited on.
		next := meta.LastIndex
		if next < index {
			next = 0
		}
		index = max(next, 1)
		var value []byte
		if pair != nil {
			value = pair.Value
		}
		switch {
		case w.cfg.MaxValue > 0 && len(value) > w.cfg.MaxValue:
			w.mu.Lock()
			w.stats.Oversized++
			w.mu.Unlock()
		case !seen || !bytes.Equal(value, last) || (value == nil) != (last == nil):
			seen, last = true, bytes.Clone(value)
			if value == nil {
				last = nil
			}
			w.mu.Lock()
			w.stats.Updates++
			w.mu.Unlock()
			w.onParams(last, meta.LastIndex)
		}
		if wait := gap - time.Since(started); wait > 0 && !sleep(ctx.Done(), wait) {
			return nil
		}
	}
}
