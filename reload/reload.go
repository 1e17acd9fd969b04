// Package reload watches the descriptor directory and hands each new, fully
// valid configuration to the daemon. It sees in-place edits, new and removed
// files, and the symlink swap Kubernetes does when a ConfigMap changes
// (..data -> ..2026_12_02_...). A change is applied only after the directory has
// been quiet for the debounce period, and only if every file is valid: a bad
// edit leaves the running rules, and their buckets, exactly as they were.
package reload

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/source"
)

// Watcher reloads Dir on change. Its exported fields are set before Run and not
// changed after. It starts no goroutine until Run.
type Watcher struct {
	Dir string
	// Debounce is how long the directory must be quiet before a reload.
	Debounce time.Duration
	// Poll is a safety net for changes fsnotify cannot see (an edit to a symlink
	// target outside Dir, a directory recreated under us): every Poll the
	// contents are fingerprinted and a change triggers a reload. 0 disables it.
	Poll time.Duration
	Log  *slog.Logger
	// Apply installs a valid set. Error reports a set that failed to load; the
	// old one stays.
	Apply func(*descriptors.Set)
	Error func(error)

	last [32]byte // fingerprint of the contents last loaded or attempted

	newWatcher func() (*fsnotify.Watcher, error) // nil means fsnotify.NewWatcher
}

// Load loads Dir once, applying it on success. It is what Run does on a change,
// and what the daemon calls at start-up.
func (w *Watcher) Load() error { return w.load(fingerprint(w.Dir)) }

// load loads Dir, whose contents fingerprint to fp.
func (w *Watcher) load(fp [32]byte) error {
	w.last = fp
	set, err := source.Load(w.Dir)
	if err != nil {
		if w.Error != nil {
			w.Error(err)
		}
		return err
	}
	w.Apply(set)
	return nil
}

// Run watches until ctx ends, then returns nil.
func (w *Watcher) Run(ctx context.Context) error {
	newWatcher := w.newWatcher
	if newWatcher == nil {
		newWatcher = fsnotify.NewWatcher
	}
	fw, err := newWatcher()
	if err != nil {
		return fmt.Errorf("watch %s: %w", w.Dir, err)
	}
	defer fw.Close()
	watching := fw.Add(w.Dir) == nil
	if !watching {
		w.Log.Warn("cannot watch config dir; polling only", "dir", w.Dir, "poll", w.Poll)
	}
	var debounce <-chan time.Time
	var timer *time.Timer
	var poll <-chan time.Time
	if w.Poll > 0 {
		t := time.NewTicker(w.Poll)
		defer t.Stop()
		poll = t.C
	}
	trigger := func() {
		if timer == nil {
			timer = time.NewTimer(w.Debounce)
		} else {
			timer.Reset(w.Debounce)
		}
		debounce = timer.C
	}
	for {
		select {
		case <-ctx.Done():
			if timer != nil {
				timer.Stop()
			}
			return nil
		case ev, ok := <-fw.Events:
			if !ok {
				return nil
			}
			w.Log.Debug("config dir event", "event", ev.String())
			trigger()
		case err, ok := <-fw.Errors:
			if !ok {
				return nil
			}
			w.Log.Warn("config dir watch error", "err", err)
			trigger()
		case <-poll:
			if !watching {
				watching = fw.Add(w.Dir) == nil
			}
			if fingerprint(w.Dir) != w.last {
				trigger()
			}
		case <-debounce:
			debounce = nil
			fp := fingerprint(w.Dir)
			if fp == w.last {
				continue // events without a change in content (a touch, a chmod)
			}
			if !watching {
				watching = fw.Add(w.Dir) == nil
			}
			w.load(fp)
		}
	}
}

// fingerprint hashes the names and contents of the config files, or the error
// that stopped it from reading them.
func fingerprint(dir string) [32]byte {
	h := sha256.New()
	files, err := source.ListDir(dir)
	if err != nil {
		fmt.Fprintf(h, "error %v", errors.Unwrap(err))
		return [32]byte(h.Sum(nil))
	}
	for _, f := range files {
		fmt.Fprintf(h, "%s\x00", f)
		if fh, err := os.Open(f); err == nil {
			io.Copy(h, fh)
			fh.Close()
		} else {
			fmt.Fprintf(h, "error %v", err)
		}
		h.Write([]byte{0})
	}
	return [32]byte(h.Sum(nil))
}
