package consulkv

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// Snapshot is one consistent read of a service's reports.
type Snapshot struct {
	// Index is the Consul index the read reflects: every report in it was
	// written at or before it.
	Index   uint64
	Reports []KVReport // sorted by node
}

// KVReport is one report as read.
type KVReport struct {
	Node        string
	Value       []byte // nil when Oversized
	ModifyIndex uint64
	Session     string
	// Oversized: the value was larger than MaxValue, and is not given.
	Oversized bool
}

// LeaderConfig configures a Leader.
type LeaderConfig struct {
	Keys Keys
	Node string // written as the lock's value, for people reading KV
	// Interval is how often the leader divides; Every, when set, is asked
	// before each wait and may stretch it (the service's write budget).
	Interval time.Duration
	Every    func() time.Duration
	// MaxValue bounds a report: larger ones are passed to divide without
	// their value, marked Oversized, and counted.
	MaxValue int
	// Steal, when set, is asked about a lock held by another session, with
	// the holder's node: true destroys the holder's session (which frees
	// the lock and deletes that session's report), for a holder known to be
	// gone, without waiting up to twice the session TTL for Consul to
	// expire it.
	Steal  func(holder string) bool
	Logger *slog.Logger
}

// LeaderStats are a leader's counters.
type LeaderStats struct {
	Snapshots, Writes, Skipped, Errors uint64
	LastError                          string
	Since                              time.Time // when it last took the lock; zero while not leading
}

// Leader campaigns for the service's leader lock with the session; while it
// holds it, it divides every interval: it reads the reports with a consistent
// read, calls divide with them and writes what divide returns to the
// parameters key, in a transaction that first checks it still holds the lock,
// so a deposed leader never overwrites its successor's parameters.
type Leader struct {
	client *api.Client
	cfg    LeaderConfig
	s      *Session
	divide func(Snapshot) ([]byte, error)
	log    *slog.Logger

	mu      sync.Mutex
	leading bool
	stats   LeaderStats
}

// NewLeader returns a leader that Run makes campaign.
func NewLeader(client *api.Client, cfg LeaderConfig, s *Session, divide func(Snapshot) ([]byte, error)) (*Leader, error) {
	if client == nil || s == nil || divide == nil {
		return nil, fmt.Errorf("consulkv leader: nil client, session or divide")
	}
	if cfg.Interval <= 0 {
		return nil, fmt.Errorf("consulkv leader: interval %s", cfg.Interval)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Leader{client: client, cfg: cfg, s: s, divide: divide, log: log}, nil
}

// IsLeader reports whether this replica holds the lock, as last known.
func (l *Leader) IsLeader() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leading
}

// Stats returns the leader's counters.
func (l *Leader) Stats() LeaderStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.stats
}

func (l *Leader) setLeading(on bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if on && !l.leading {
		l.stats.Since = time.Now()
	}
	if !on {
		l.stats.Since = time.Time{}
	}
	l.leading = on
}

func (l *Leader) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.stats.Errors++
	l.stats.LastError = err.Error()
}

// Run campaigns and divides until ctx ends.
func (l *Leader) Run(ctx context.Context) error {
	defer l.setLeading(false)
	errs := 0
	var gen uint64
	var waitIndex uint64
	for ctx.Err() == nil {
		id, g := l.s.ID()
		if id == "" {
			l.setLeading(false)
			if !sleep(ctx.Done(), 200*time.Millisecond) {
				return nil
			}
			continue
		}
		if l.IsLeader() && g != gen {
			l.setLeading(false) // the lock went with the old session
		}
		var err error
		if !l.IsLeader() {
			var got bool
			if got, waitIndex, err = l.campaign(ctx, id, waitIndex); err == nil && got {
				gen = g
				l.setLeading(true)
				l.log.Info("leading the demand division", "service", l.cfg.Keys.Service, "node", l.cfg.Node)
				continue
			}
		} else {
			if err = l.round(ctx, id); err == nil {
				if !sleep(ctx.Done(), l.every()) {
					return nil
				}
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			if strings.Contains(err.Error(), "invalid session") {
				// Destroyed behind our back: have a new one made now,
				// not at the next renewal.
				l.s.Check()
			}
			errs++
			l.fail(err)
			l.log.Warn("demand leader", "service", l.cfg.Keys.Service, "err", err)
			if !sleep(ctx.Done(), backoff(errs)) {
				return nil
			}
		} else {
			errs = 0
		}
	}
	return nil
}

// every is the time between divisions.
func (l *Leader) every() time.Duration {
	if l.cfg.Every != nil {
		return max(l.cfg.Interval, l.cfg.Every())
	}
	return l.cfg.Interval
}

// campaign tries to take the lock; when it is held, it waits (a blocking
// query, up to a few seconds) for the key to change before returning.
func (l *Leader) campaign(ctx context.Context, id string, index uint64) (bool, uint64, error) {
	key := l.cfg.Keys.Leader()
	ok, _, err := l.client.KV().Acquire(&api.KVPair{Key: key, Value: []byte(l.cfg.Node), Session: id}, (&api.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return false, index, fmt.Errorf("acquire %s: %w", key, err)
	}
	if ok {
		return true, index, nil
	}
	// Followers wait on the lock key up to four division rounds (at least a
	// second), so N of them ask Consul N/(4 rounds) times a second, and a
	// gone leader is noticed within that.
	wait := max(time.Second, 4*l.every())
	pair, meta, err := l.client.KV().Get(key, (&api.QueryOptions{WaitIndex: index, WaitTime: wait}).WithContext(ctx))
	if err != nil {
		return false, 0, fmt.Errorf("watch %s: %w", key, err)
	}
	if pair != nil && pair.Session != "" && pair.Session != id && l.cfg.Steal != nil && l.cfg.Steal(string(pair.Value)) {
		if _, err := l.client.Session().Destroy(pair.Session, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
			return false, index, fmt.Errorf("end the session of gone leader %q: %w", pair.Value, err)
		}
		l.log.Warn("ended the session of a leader that is gone", "service", l.cfg.Keys.Service, "leader", string(pair.Value), "session", pair.Session)
		return false, 0, nil
	}
	next := meta.LastIndex
	if next < index {
		next = 0
	}
	if pair != nil && pair.Session != "" && next == index {
		// Nothing changed; pace the next try.
		sleep(ctx.Done(), 100*time.Millisecond)
	}
	return false, next, nil
}

// round divides once and writes the parameters while holding the lock.
func (l *Leader) round(ctx context.Context, id string) error {
	pairs, meta, err := l.client.KV().List(l.cfg.Keys.Reports(), (&api.QueryOptions{RequireConsistent: true}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("read reports: %w", err)
	}
	snap := Snapshot{Index: meta.LastIndex}
	skipped := 0
	for _, p := range pairs {
		node := strings.TrimPrefix(p.Key, l.cfg.Keys.Reports())
		if node == "" || strings.Contains(node, "/") {
			continue
		}
		r := KVReport{Node: node, Value: p.Value, ModifyIndex: p.ModifyIndex, Session: p.Session}
		if l.cfg.MaxValue > 0 && len(p.Value) > l.cfg.MaxValue {
			skipped++
			r.Value, r.Oversized = nil, true
		}
		snap.Reports = append(snap.Reports, r)
	}
	slices.SortFunc(snap.Reports, func(a, b KVReport) int { return strings.Compare(a.Node, b.Node) })
	value, err := l.divide(snap)
	l.mu.Lock()
	l.stats.Snapshots++
	l.stats.Skipped += uint64(skipped)
	l.mu.Unlock()
	if err != nil {
		return fmt.Errorf("divide: %w", err)
	}
	ok, resp, _, err := l.client.Txn().Txn(api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: l.cfg.Keys.Leader(), Session: id}},
		{KV: &api.KVTxnOp{Verb: api.KVSet, Key: l.cfg.Keys.Params(), Value: value}},
	}, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return fmt.Errorf("write parameters: %w", err)
	}
	if !ok {
		var msg string
		if resp != nil && len(resp.Errors) > 0 {
			msg = resp.Errors[0].What
		}
		l.setLeading(false)
		l.log.Warn("lost the demand lead", "service", l.cfg.Keys.Service, "why", msg)
		return nil
	}
	l.mu.Lock()
	l.stats.Writes++
	l.mu.Unlock()
	return nil
}
