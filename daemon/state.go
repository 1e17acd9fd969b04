package daemon

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sharelimit/sharelimit/descriptors"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/membership"
	"github.com/sharelimit/sharelimit/state"
)

// futureSlack is how far in the future a state file's time may be before
// the file is refused: clocks of one machine across a restart agree better
// than this, and a file from further ahead means the clock stepped back or
// the file is not this daemon's.
const futureSlack = time.Minute

// keeper is --state-file: it reads the snapshot at start and writes it on
// shutdown and every --state-interval. Writes are serialised.
type keeper struct {
	path   string
	maxAge time.Duration
	d      *Daemon

	mu sync.Mutex // one write at a time
	// writing counts the goroutines of writes begun and not yet over, those
	// waiting for mu included: a stop abandons stuck ones, and tests wait for
	// them. Added to before each goroutine starts.
	writing sync.WaitGroup

	loadErrors  prometheus.Counter
	writes      prometheus.Counter
	writeErrors prometheus.Counter
	lastWrite   prometheus.Gauge // seconds one write took
	lastBuckets prometheus.Gauge
	restored    prometheus.Gauge
	restoreTime prometheus.Gauge

	// oldViews are the views of a file older than --state-max-age that
	// are no looser than --replicas: they stand until their sources
	// answer, as a younger file's do, while its buckets are dropped.
	oldViews []state.View

	// lastErr is the last write's error, "" after a success: a failure
	// logs at ERROR when its cause changes, not on every checkpoint, since
	// a read-only directory fails every --state-interval the same way.
	lastErr string
}

func newKeeper(d *Daemon, reg prometheus.Registerer) *keeper {
	k := &keeper{path: d.cfg.StateFile, maxAge: d.cfg.StateMaxAge, d: d,
		loadErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "sharelimit_state_load_errors_total",
			Help: "State files not restored at start because they were unreadable, corrupt, of another version, oversized or from the future."}),
		writes: prometheus.NewCounter(prometheus.CounterOpts{Name: "sharelimit_state_writes_total",
			Help: "State files written (checkpoints and the one on shutdown)."}),
		writeErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "sharelimit_state_write_errors_total",
			Help: "State file writes that failed."}),
		lastWrite: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_state_write_seconds",
			Help: "How long the last state file write took."}),
		lastBuckets: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_state_written_buckets",
			Help: "Buckets in the last state file written."}),
		restored: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_state_restored_buckets",
			Help: "Buckets restored from the state file at start."}),
		restoreTime: prometheus.NewGauge(prometheus.GaugeOpts{Name: "sharelimit_state_restore_seconds",
			Help: "How long reading and restoring the state file took at start."}),
	}
	reg.MustRegister(k.loadErrors, k.writes, k.writeErrors, k.lastWrite, k.lastBuckets, k.restored, k.restoreTime)
	return k
}

// load reads the snapshot, of at most maxBuckets buckets, or returns nil:
// no file, a file too old, or a bad one (one warning and the metric).
// Whatever it returns nil for, the daemon starts as it would without
// --state-file, except that of a file too old it keeps the views no looser
// than --replicas (savedView).
func (k *keeper) load(now time.Time, maxBuckets int) *state.Snapshot {
	k.removeTemps()
	k.probe()
	s, err := state.ReadFile(k.path, state.MaxSize(maxBuckets))
	switch {
	case errors.Is(err, fs.ErrNotExist):
		k.d.log.Info("no state file to restore; starting with full buckets", "path", k.path)
		return nil
	case err != nil:
		k.loadErrors.Inc()
		k.d.log.Warn("state file not restored; starting with full buckets", "path", k.path, "err", err)
		return nil
	}
	age := now.Sub(s.Written)
	switch {
	case age < -futureSlack:
		k.loadErrors.Inc()
		k.d.log.Warn("state file not restored: written in the future (did the clock step back?); starting with full buckets",
			"path", k.path, "written", s.Written, "ahead", -age)
		return nil
	case age > k.maxAge:
		// A count of replicas does not go stale the way tokens do: a
		// saved view that divides at least as finely as --replicas is
		// tighter than --replicas whatever its age, and it stands
		// until the source answers, as a younger file's does.
		w := 1 / float64(max(k.d.cfg.Replicas, 1))
		for _, v := range s.Views {
			if v.Weight > 0 && v.Weight <= w {
				k.oldViews = append(k.oldViews, v)
			}
		}
		k.d.log.Info("state file older than --state-max-age; starting with full buckets", "path", k.path, "age", age, "max_age", k.maxAge,
			"views_restored", len(k.oldViews))
		return nil
	}
	if s.Seed == 0 {
		// No engine keys with 0 (engine.Options.Seed asks for a fresh
		// seed with it): the buckets could not be found.
		k.loadErrors.Inc()
		k.d.log.Warn("state file not restored: its key seed is not usable; starting with full buckets", "path", k.path)
		return nil
	}
	return &s
}

// elapsed is the time the buckets of s refill for: the wall clock since it
// was written, 0 if the clock stepped back a little since (no refill is
// tighter, never looser).
func elapsed(s *state.Snapshot, now time.Time) time.Duration { return max(now.Sub(s.Written), 0) }

// restore puts the snapshot's buckets into the engine. It runs before the
// listeners open: nothing is served while buckets are still being restored.
func (k *keeper) restore(s *state.Snapshot, set *descriptors.Set, started time.Time) {
	saved := map[uint16]string{} // saved group -> its view's key
	for _, v := range s.Views {
		saved[v.Group] = v.Service
	}
	groupOf := func(g uint16) (uint16, bool) {
		if g == 0 {
			return 0, true // share: replica
		}
		key, ok := saved[g]
		if !ok {
			return 0, false
		}
		for _, v := range k.d.views {
			// A view with no Consul service (static or DNS) takes the
			// buckets either saved: they are its rules', whichever of
			// the two counted the replicas (and a DNS view's were saved
			// under "" before it had a key of its own).
			if v.stateKey() == key || v.service == "" && (key == "" || strings.HasPrefix(key, dnsKeyPrefix)) {
				return uint16(v.group), true
			}
		}
		return 0, false
	}
	now := time.Now()
	var res engine.Restored
	if set != nil {
		res = k.d.engine.RestoreFor(set, s.Buckets, s.Weights, elapsed(s, now), groupOf, k.d.clock())
	} else {
		res = k.d.engine.Restore(s.Buckets, s.Weights, elapsed(s, now), groupOf, k.d.clock())
	}
	took := time.Since(started)
	k.restored.Set(float64(res.Kept))
	k.restoreTime.Set(took.Seconds())
	k.d.log.Info("state restored", "path", k.path, "written", s.Written, "down", elapsed(s, now).Round(time.Millisecond),
		"buckets", len(s.Buckets), "restored", res.Kept, "refilled_meanwhile", res.Full, "rule_gone_or_changed", res.Gone,
		"no_room", res.NoRoom, "took", took.Round(time.Millisecond))
}

// initial is the saved view under key (a Consul service, or dnsKey of a
// name), to stand until the source first answers; nil when the snapshot has
// none.
func initial(s *state.Snapshot, key string) *membership.View {
	if s == nil || key == "" {
		return nil
	}
	for _, v := range s.Views {
		if v.Service == key {
			return &membership.View{Total: v.Total, Local: v.Local, TotalWeight: v.TotalWeight, LocalWeight: v.LocalWeight, Weight: v.Weight}
		}
	}
	return nil
}

// savedView is the saved view under key, to stand until the source first
// answers: the snapshot's, or else one of a file older than
// --state-max-age that is no looser than --replicas; nil when there is
// none.
func (d *Daemon) savedView(key string) *membership.View {
	if v := initial(d.snap, key); v != nil || d.state == nil {
		return v
	}
	return initial(&state.Snapshot{Header: state.Header{Views: d.state.oldViews}}, key)
}

// dnsKey is the key a DNS view of name is saved under: one of its own, so
// that neither a static view's count nor another name's stands for it.
func dnsKey(name string) string { return dnsKeyPrefix + name }

const dnsKeyPrefix = "dns:"

// stateKey is the key v is saved under: its Consul service, dnsKey of its
// DNS name, or "" for a static view.
func (v *view) stateKey() string {
	if v.name != "" {
		return dnsKey(v.name)
	}
	return v.service
}

// write saves the state now. It returns how many buckets it wrote.
func (k *keeper) write(why string) (uint64, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	start := time.Now()
	h := state.Header{Written: start, Seed: k.d.engine.Seed(), Weights: k.d.engine.Weights()}
	for _, v := range k.d.views {
		mv := v.cur.Load()
		h.Views = append(h.Views, state.View{Group: uint16(v.group), Service: v.stateKey(), Total: mv.Total, Local: mv.Local,
			TotalWeight: mv.TotalWeight, LocalWeight: mv.LocalWeight, Weight: mv.Weight})
	}
	now := k.d.clock()
	n, size, err := state.WriteFile(k.path, h, func(add func([]bucket.Saved) error) error {
		var err error
		k.d.engine.Export(now, func(b []bucket.Saved) {
			if err == nil {
				err = add(b)
			}
		})
		return err
	})
	took := time.Since(start)
	if err != nil {
		k.writeErrors.Inc()
		if msg := causeOf(err); msg != k.lastErr {
			k.lastErr = msg
			k.d.log.Error("state file not written; until it is, a restart starts with full buckets (logged again when the cause changes; sharelimit_state_write_errors_total counts every failure)",
				"path", k.path, "why", why, "err", err)
		} else {
			k.d.log.Debug("state file not written", "path", k.path, "why", why, "err", err)
		}
		return 0, err
	}
	if k.lastErr != "" {
		k.lastErr = ""
		k.d.log.Info("state file written again", "path", k.path)
	}
	k.writes.Inc()
	k.lastWrite.Set(took.Seconds())
	k.lastBuckets.Set(float64(n))
	k.d.log.Debug("state written", "path", k.path, "why", why, "buckets", n, "bytes", size, "took", took)
	return n, nil
}

// finalWrite is the write on shutdown, after the gRPC server stopped (no
// decision changes a bucket any more). It gives up waiting after timeout
// (what is left of --shutdown-timeout), so shutdown completes in time
// whatever the disk does.
func (k *keeper) finalWrite(timeout time.Duration) {
	if timeout <= 0 {
		k.writeErrors.Inc()
		k.d.log.Error("state file not written: --shutdown-timeout was spent on in-flight requests", "path", k.path)
		return
	}
	done := make(chan struct{})
	k.writing.Add(1)
	go func() {
		defer k.writing.Done()
		defer close(done)
		if n, err := k.write("shutdown"); err == nil {
			k.d.log.Info("state written", "path", k.path, "buckets", n)
		}
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		k.writeErrors.Inc()
		k.d.log.Error("state file not written within --shutdown-timeout; stopping without it", "path", k.path, "timeout", timeout)
	}
}

// checkpoints writes the state every interval until ctx ends. Each write
// runs on a goroutine of its own, so a disk that hangs holds up neither the
// next tick's check of ctx nor the daemon's stop: a stop while a write is
// stuck returns at once (the write is abandoned with the process), and a
// tick that finds the last write still running skips.
func (k *keeper) checkpoints(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	var busy chan struct{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		if busy != nil {
			select {
			case <-busy:
			default:
				k.d.log.Warn("state checkpoint skipped: the last one is still being written", "path", k.path)
				continue
			}
		}
		busy = make(chan struct{})
		k.writing.Add(1)
		go func(done chan struct{}) {
			defer k.writing.Done()
			defer close(done)
			k.write("checkpoint") //nolint:errcheck // logged and counted
		}(busy)
	}
}

// removeTemps removes the temporary files of writes a crash cut short.
func (k *keeper) removeTemps() {
	dir, base := filepath.Dir(k.path), "."+filepath.Base(k.path)+".tmp-"
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), base) && e.Type().IsRegular() {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}

// causeOf is what makes two write errors the same failure: a path error's
// operation and errno, not its path, which names a fresh temporary file each
// time.
func causeOf(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Op + ": " + pe.Err.Error()
	}
	return err.Error()
}

// probe checks at start that the state file's directory takes a file, and
// warns once if not: a read-only root filesystem, or a directory another
// user owns, would otherwise surface only at the first checkpoint.
func (k *keeper) probe() {
	dir := filepath.Dir(k.path)
	f, err := os.CreateTemp(dir, ".sharelimit-probe-*")
	if err == nil {
		f.Close()
		os.Remove(f.Name())
		return
	}
	k.d.log.Warn("state file cannot be written: a restart will start with full buckets; mount a writable volume at "+dir+
		" (an emptyDir in Kubernetes), or set SHARELIMIT_STATE_FILE= to turn saving off", "path", k.path, "err", err)
}
