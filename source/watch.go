package source

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/sharelimit/sharelimit/descriptors"
)

// Watcher is the file source: it watches the descriptor directory and hands
// each new, fully valid set to Apply. It sees in-place edits, new and removed
// files, and the symlink swap Kubernetes does when a ConfigMap changes
// (..data -> ..2026_12_02_...). A change is applied only after the directory
// has been quiet for the debounce period, and only if every file is valid: a
// bad edit leaves the running rules, and their buckets, exactly as they were.
//
// Its exported fields are set before Run and not changed after. It starts no
// goroutine until Run. Only Polling may be called while Run runs.
type Watcher struct {
	Dir string
	// Debounce is how long the directory must be quiet before a reload.
	Debounce time.Duration
	// Poll is a safety net for changes fsnotify cannot see (an edit to a symlink
	// target outside Dir, a directory recreated under us): every Poll the
	// contents are fingerprinted and a change triggers a reload. 0 disables it
	// while fsnotify works; without fsnotify, 0 means DefaultPoll.
	Poll time.Duration
	Log  *slog.Logger
	// Apply installs a valid set. It may refuse it by returning an error, as
	// every source's apply may (xDS answers that with a NACK). Error reports a
	// set that failed to load or was refused; the one in force stays.
	Apply func(*descriptors.Set) error
	Error func(error)
	// Options are how Dir is read and its files compiled. With AllFiles,
	// changes in subdirectories are seen by the poll.
	Options Options

	last    [32]byte // fingerprint of the contents last loaded or attempted
	polling atomic.Bool

	newWatcher func() (*fsnotify.Watcher, error) // nil means fsnotify.NewWatcher; tests fail it
}

// DefaultPoll is how often Run looks at Dir when fsnotify is unavailable and
// Poll is 0: without events, polling is the only way to see a change.
const DefaultPoll = 10 * time.Second

// Polling reports whether Run sees changes by polling alone, because fsnotify
// could not start or could not watch Dir (on Linux, usually because
// fs.inotify.max_user_instances or max_user_watches is exhausted). A change
// then takes up to a poll interval, plus the debounce, to apply. Safe for
// concurrent use.
func (w *Watcher) Polling() bool { return w.polling.Load() }

// Load loads Dir once, applying it on success. It is what Run does on a change,
// and what the daemon calls at start-up.
func (w *Watcher) Load() error { return w.load(w.fingerprint()) }

// load loads Dir, whose contents fingerprint to fp.
func (w *Watcher) load(fp [32]byte) error {
	w.last = fp
	set, err := LoadWith(w.Options, w.Dir)
	if err == nil {
		err = w.Apply(set)
	}
	if err != nil && w.Error != nil {
		w.Error(err)
	}
	return err
}

// Run watches until ctx ends, then returns nil. When fsnotify cannot start or
// cannot watch Dir, Run does not fail: it polls, warns once, reports it through
// Polling, and tries fsnotify again on every poll.
func (w *Watcher) Run(ctx context.Context) error {
	newWatcher := w.newWatcher
	if newWatcher == nil {
		newWatcher = fsnotify.NewWatcher
	}
	var fw *fsnotify.Watcher
	defer func() {
		if fw != nil {
			fw.Close()
		}
	}()
	var events <-chan fsnotify.Event // nil, and so never ready, without fsnotify
	var errs <-chan error
	// watch starts fsnotify if it is not running yet and adds Dir. Either step
	// can fail for a while: a node short of inotify instances may free some, and
	// a missing Dir may appear.
	watch := func() error {
		if fw == nil {
			f, err := newWatcher()
			if err != nil {
				return fmt.Errorf("start fsnotify: %w", err)
			}
			fw, events, errs = f, f.Events, f.Errors
		}
		return fw.Add(w.Dir)
	}
	rewatch := func() {
		if w.polling.Load() && watch() == nil {
			w.polling.Store(false)
			w.Log.Info("watching config dir for changes again", "dir", w.Dir)
		}
	}

	poll := w.Poll
	if err := watch(); err != nil {
		if poll <= 0 {
			poll = DefaultPoll
		}
		w.polling.Store(true)
		w.Log.Warn("cannot watch config dir; polling only", "dir", w.Dir, "poll", poll, "err", err)
	}
	var tick <-chan time.Time
	if poll > 0 {
		t := time.NewTicker(poll)
		defer t.Stop()
		tick = t.C
	}
	var debounce <-chan time.Time
	var timer *time.Timer
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
		case ev, ok := <-events:
			if !ok {
				return nil
			}
			w.Log.Debug("config dir event", "event", ev.String())
			trigger()
		case err, ok := <-errs:
			if !ok {
				return nil
			}
			w.Log.Warn("config dir watch error", "err", err)
			trigger()
		case <-tick:
			rewatch()
			// A poll is not an event: it must not push back a reload already
			// scheduled, or a Poll shorter than Debounce would postpone it for ever.
			if debounce == nil && w.fingerprint() != w.last {
				trigger()
			}
		case <-debounce:
			debounce = nil
			fp := w.fingerprint()
			if fp == w.last {
				continue // events without a change in content (a touch, a chmod)
			}
			rewatch()
			w.load(fp)
		}
	}
}

// fingerprint hashes the names and contents of the config files, or the error
// that stopped it from reading them.
func (w *Watcher) fingerprint() [32]byte {
	h := sha256.New()
	files, err := ListFiles(w.Dir, w.Options.AllFiles)
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
