package consulkv

import (
	"bytes"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"go.uber.org/goleak"

	"github.com/sharelimit/sharelimit/internal/consultest"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var testKeys = Keys{Prefix: "test/demand/", Service: "web"}

// runSession starts a session and returns it with a stop function that ends
// Run and waits for it.
func runSession(t *testing.T, client *api.Client, name string) (*Session, func()) {
	t.Helper()
	s, err := NewSession(client, SessionConfig{Name: name, TTL: MinTTL})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	testutil.Eventually(t, 5*time.Second, testutil.Cond(func() bool { id, _ := s.ID(); return id != "" }, "session created"))
	return s, stop
}

// rawSession creates a session nobody renews. A fresh agent refuses sessions
// until it has registered its own node ("Missing node registration"), so it
// retries for a few seconds, as Session.Run does.
func rawSession(t *testing.T, client *api.Client, e *api.SessionEntry) string {
	t.Helper()
	var id string
	testutil.Eventually(t, 30*time.Second, func() (err error) {
		id, _, err = client.Session().CreateNoChecks(e, nil)
		return err
	})
	return id
}

func TestSessionConfig(t *testing.T) {
	for _, ttl := range []time.Duration{0, 9 * time.Second, 25 * time.Hour} {
		if _, err := NewSession(&api.Client{}, SessionConfig{TTL: ttl}); err == nil {
			t.Errorf("TTL %s accepted", ttl)
		}
	}
	if _, err := NewSession(nil, SessionConfig{TTL: MinTTL}); err == nil {
		t.Error("nil client accepted")
	}
}

// TestSessionLifecycle: the session has the TTL, no checks (so it does not
// depend on a serf check the node may not have) and behaviour delete; a
// report it holds goes with it when Run ends; a session destroyed behind its
// back is replaced, with a new generation.
func TestSessionLifecycle(t *testing.T) {
	a := consultest.Start(t)
	client := a.Client()
	s, stop := runSession(t, client, "lifecycle")
	id, gen := s.ID()
	if gen != 1 {
		t.Errorf("first generation %d", gen)
	}
	info, _, err := client.Session().Info(id, nil)
	if err != nil || info == nil {
		t.Fatalf("session info: %v %v", info, err)
	}
	if info.TTL != "10s" || info.Behavior != api.SessionBehaviorDelete || len(info.Checks) != 0 || len(info.NodeChecks) != 0 {
		t.Errorf("session TTL %q behavior %q checks %v node checks %v; want 10s, delete, none", info.TTL, info.Behavior, info.Checks, info.NodeChecks)
	}
	if info.LockDelay > time.Second {
		t.Errorf("lock delay %s: a new leader would wait that long", info.LockDelay)
	}

	pub := NewPublisher(client, testKeys, "node-a", s)
	if _, err := pub.Publish(context.Background(), []byte("r1")); err != nil {
		t.Fatal(err)
	}
	// Destroyed behind its back: Run notices at the next renewal (TTL/2).
	if _, err := client.Session().Destroy(id, nil); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 8*time.Second, testutil.Cond(func() bool { nid, g := s.ID(); return nid != "" && nid != id && g == 2 }, "a new session"))
	if pair, _, _ := client.KV().Get(testKeys.Report("node-a"), nil); pair != nil {
		t.Errorf("the report outlived its destroyed session: %+v", pair)
	}
	if _, err := pub.Publish(context.Background(), []byte("r2")); err != nil {
		t.Fatal(err)
	}
	stop()
	if id, _ := s.ID(); id != "" {
		t.Errorf("ID %q after Run ended", id)
	}
	if pair, _, _ := client.KV().Get(testKeys.Report("node-a"), nil); pair != nil {
		t.Errorf("the report outlived the session Run destroyed on its way out")
	}
}

// TestSessionLinger: a lingering session is left to its TTL when Run ends,
// and its report with it, for the replica's next process to take over.
func TestSessionLinger(t *testing.T) {
	a := consultest.Start(t)
	client := a.Client()
	s, err := NewSession(client, SessionConfig{Name: "linger", TTL: MinTTL, Linger: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { id, _ := s.ID(); return id != "" }, "session created"))
	id, _ := s.ID()
	if _, err := NewPublisher(client, testKeys, "node-a", s).Publish(context.Background(), []byte("r1")); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	if info, _, err := client.Session().Info(id, nil); err != nil || info == nil {
		t.Fatalf("the lingering session after Run ended: %v %v", info, err)
	}
	if pair, _, _ := client.KV().Get(testKeys.Report("node-a"), nil); pair == nil || string(pair.Value) != "r1" {
		t.Errorf("the report after a lingering Run ended: %+v", pair)
	}
	if _, err := client.Session().Destroy(id, nil); err != nil {
		t.Fatal(err)
	}
}

// TestPublisher: a write is held by the session and returns the index
// Consul gave it; without a session there is nothing to write with; a key
// another session holds is refused, and nothing is written.
func TestPublisher(t *testing.T) {
	a := consultest.Start(t)
	client := a.Client()
	none, _ := NewSession(client, SessionConfig{TTL: MinTTL})
	if _, err := NewPublisher(client, testKeys, "n", none).Publish(context.Background(), []byte("x")); !errors.Is(err, ErrNoSession) {
		t.Errorf("before the session: %v, want ErrNoSession", err)
	}
	s, _ := runSession(t, client, "pub")
	pub := NewPublisher(client, testKeys, "node-a", s)
	var last uint64
	for i, v := range []string{"one", "two", "three"} {
		idx, err := pub.Publish(context.Background(), []byte(v))
		if err != nil {
			t.Fatal(err)
		}
		pair, _, err := client.KV().Get(testKeys.Report("node-a"), nil)
		if err != nil || pair == nil {
			t.Fatalf("read back: %v", err)
		}
		id, _ := s.ID()
		if idx <= last || pair.ModifyIndex != idx || string(pair.Value) != v || pair.Session != id {
			t.Errorf("write %d: index %d (previous %d), key at %d holding %q by %q", i, idx, last, pair.ModifyIndex, pair.Value, pair.Session)
		}
		last = idx
	}
	other, _ := runSession(t, client, "other")
	_, err := NewPublisher(client, testKeys, "node-a", other).Publish(context.Background(), []byte("theirs"))
	if !errors.Is(err, ErrRefused) {
		t.Errorf("a key another session holds: %v, want ErrRefused", err)
	}
	if pair, _, _ := client.KV().Get(testKeys.Report("node-a"), nil); pair == nil || string(pair.Value) != "three" {
		t.Errorf("a refused write changed the key: %+v", pair)
	}
}

// TestLeader: of two campaigners one leads; its division sees every report
// at a snapshot index no lower than theirs and writes the parameters; when
// its session ends the other takes over; a deposed leader's guarded write
// fails.
func TestLeader(t *testing.T) {
	a := consultest.Start(t)
	client := a.Client()
	type camp struct {
		s      *Session
		stop   func()
		l      *Leader
		snaps  atomic.Int64
		last   atomic.Pointer[Snapshot]
		cancel context.CancelFunc
		done   chan struct{}
	}
	var cs [2]*camp
	for i, node := range []string{"node-a", "node-b"} {
		c := &camp{done: make(chan struct{})}
		c.s, c.stop = runSession(t, client, node)
		pub := NewPublisher(client, testKeys, node, c.s)
		if _, err := pub.Publish(context.Background(), []byte("report of "+node)); err != nil {
			t.Fatal(err)
		}
		var err error
		c.l, err = NewLeader(client, LeaderConfig{Keys: testKeys, Node: node, Interval: 100 * time.Millisecond, MaxValue: 64}, c.s,
			func(s Snapshot) ([]byte, error) {
				c.snaps.Add(1)
				c.last.Store(&s)
				return []byte("params from " + node), nil
			})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		c.cancel = cancel
		go func() { c.l.Run(ctx); close(c.done) }()
		t.Cleanup(func() { cancel(); <-c.done })
		cs[i] = c
	}
	// An oversized report is marked, passed without its value, and counted.
	if _, err := client.KV().Put(&api.KVPair{Key: testKeys.Report("huge"), Value: bytes.Repeat([]byte("x"), 65)}, nil); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, testutil.Cond(func() bool {
		return (cs[0].l.IsLeader() != cs[1].l.IsLeader()) && (cs[0].snaps.Load()+cs[1].snaps.Load()) >= 3
	}, "one leader dividing"))
	lead, follow := cs[0], cs[1]
	if cs[1].l.IsLeader() {
		lead, follow = cs[1], cs[0]
	}
	snap := lead.last.Load()
	if len(snap.Reports) != 3 || snap.Reports[0].Node != "huge" || snap.Reports[1].Node != "node-a" || snap.Reports[2].Node != "node-b" {
		t.Fatalf("snapshot reports %+v, want huge, node-a and node-b", snap.Reports)
	}
	if huge := snap.Reports[0]; !huge.Oversized || huge.Value != nil || huge.ModifyIndex == 0 {
		t.Errorf("the oversized report is given as %+v, want marked, without its value", huge)
	}
	for _, r := range snap.Reports[1:] {
		if r.ModifyIndex > snap.Index || r.Session == "" {
			t.Errorf("report %s at index %d (session %q) in a snapshot at %d", r.Node, r.ModifyIndex, r.Session, snap.Index)
		}
	}
	if lead.l.Stats().Skipped == 0 {
		t.Errorf("the oversized report was not counted as skipped: %+v", lead.l.Stats())
	}
	pair, _, _ := client.KV().Get(testKeys.Params(), nil)
	if pair == nil || !bytes.HasPrefix(pair.Value, []byte("params from ")) {
		t.Fatalf("params %+v", pair)
	}
	if follow.snaps.Load() != 0 {
		t.Errorf("the follower divided %d times", follow.snaps.Load())
	}

	// The leader's session ends (its process dies and the session is
	// destroyed): the other takes over at once (lock delay ~0).
	oldID, _ := lead.s.ID()
	lead.cancel()
	<-lead.done
	lead.stop()
	start := time.Now()
	testutil.Eventually(t, 5*time.Second, testutil.Cond(func() bool { return follow.l.IsLeader() && follow.snaps.Load() > 0 }, "the follower takes over"))
	t.Logf("takeover after %v", time.Since(start))
	// The deposed session can no longer pass the guard.
	ok, _, _, err := client.Txn().Txn(api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVCheckSession, Key: testKeys.Leader(), Session: oldID}},
		{KV: &api.KVTxnOp{Verb: api.KVSet, Key: testKeys.Params(), Value: []byte("stale")}},
	}, nil)
	if err != nil || ok {
		t.Errorf("a deposed leader's guarded write: ok=%v err=%v, want refused", ok, err)
	}
}

// TestLeaderSteal: a leader whose Steal says it is gone loses its session to
// the campaigner, without waiting for Consul to expire it.
func TestLeaderSteal(t *testing.T) {
	a := consultest.Start(t)
	client := a.Client()
	// A session that nobody renews holds the lock, as a killed leader's.
	dead := rawSession(t, client, &api.SessionEntry{TTL: "60s", Behavior: api.SessionBehaviorDelete, LockDelay: time.Millisecond})
	if ok, _, err := client.KV().Acquire(&api.KVPair{Key: testKeys.Leader(), Value: []byte("gone-node"), Session: dead}, nil); err != nil || !ok {
		t.Fatalf("acquire for the dead leader: %v %v", ok, err)
	}
	s, _ := runSession(t, client, "thief")
	var asked atomic.Value
	l, err := NewLeader(client, LeaderConfig{Keys: testKeys, Node: "node-b", Interval: 100 * time.Millisecond,
		Steal: func(holder string) bool { asked.Store(holder); return holder == "gone-node" }}, s,
		func(Snapshot) ([]byte, error) { return []byte("p"), nil })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	testutil.Eventually(t, 5*time.Second, testutil.Cond(l.IsLeader, "the lock taken from the gone leader"))
	if asked.Load() != "gone-node" {
		t.Errorf("Steal asked about %v", asked.Load())
	}
	if info, _, _ := client.Session().Info(dead, nil); info != nil {
		t.Errorf("the gone leader's session still exists")
	}
}

// TestWatcher: each new value is delivered once; during an outage nothing
// is, errors are counted and the last value stands; afterwards it resumes.
func TestWatcher(t *testing.T) {
	a := consultest.Start(t)
	client := a.Client()
	type got struct {
		v   string
		nil bool
	}
	ch := make(chan got, 16)
	w, err := NewWatcher(client, WatcherConfig{Keys: testKeys, Rate: 20, Wait: 2 * time.Second, MaxValue: 8}, func(v []byte, _ uint64) {
		ch <- got{string(v), v == nil}
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	next := func(what string) got {
		t.Helper()
		select {
		case g := <-ch:
			return g
		case <-time.After(10 * time.Second):
			t.Fatalf("no delivery: %s", what)
			return got{}
		}
	}
	if g := next("the absent key"); !g.nil {
		t.Errorf("first delivery %+v, want the absent key (nil)", g)
	}
	put := func(v string) {
		if _, err := client.KV().Put(&api.KVPair{Key: testKeys.Params(), Value: []byte(v)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	put("v1")
	if g := next("v1"); g.v != "v1" {
		t.Errorf("got %+v, want v1", g)
	}
	put("v1") // the same value again: no delivery
	put("toolongvalue")
	put("v2")
	if g := next("v2"); g.v != "v2" {
		t.Errorf("got %+v, want v2 (the same value and the oversized one are not delivered)", g)
	}
	if w.Stats().Oversized == 0 && w.Stats().Updates < 3 {
		t.Logf("the oversized value was overtaken before the watch saw it: %+v", w.Stats())
	}
	a.Stop()
	testutil.Eventually(t, 10*time.Second, testutil.Cond(func() bool { return w.Stats().Errors > 0 }, "errors counted"))
	select {
	case g := <-ch:
		t.Errorf("delivery during the outage: %+v", g)
	default:
	}
	a.Restart()
	// The restarted agent is empty: the key is gone, and that is delivered.
	if g := next("the key gone after the restart"); !g.nil {
		t.Errorf("after the restart got %+v, want the absent key", g)
	}
	put("v3")
	if g := next("v3"); g.v != "v3" {
		t.Errorf("got %+v, want v3", g)
	}
}

// TestDeadReplicaReportExpires: a report whose session nobody renews (its
// replica was killed) disappears by itself once Consul expires the session,
// which it does between the TTL and twice the TTL. It takes 10 to 20 s, so it
// runs in parallel with the rest.
func TestDeadReplicaReportExpires(t *testing.T) {
	t.Parallel()
	a := consultest.Start(t)
	client := a.Client()
	id := rawSession(t, client, &api.SessionEntry{TTL: MinTTL.String(), Behavior: api.SessionBehaviorDelete})
	fake := &Session{client: client}
	fake.set(id)
	if _, err := NewPublisher(client, testKeys, "killed", fake).Publish(context.Background(), []byte("last words")); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	testutil.Eventually(t, 3*MinTTL, testutil.Cond(func() bool {
		pair, _, err := client.KV().Get(testKeys.Report("killed"), nil)
		return err == nil && pair == nil
	}, "the dead replica's report expires"))
	gone := time.Since(start)
	t.Logf("the report of a replica that stopped renewing went after %v (TTL %v)", gone.Round(100*time.Millisecond), MinTTL)
	if gone < MinTTL-time.Second {
		t.Errorf("the report went after %v, before the TTL", gone)
	}
}

// TestPublisherTakesOverAPreviousProcess: a process of the same node and
// service killed before its session expired left its report (and the leader
// lock) held by that session. The next process's first write ends that
// session, which deletes what it held, and writes its own report at once,
// not after the TTL. A key held by a session of another name stays refused.
func TestPublisherTakesOverAPreviousProcess(t *testing.T) {
	a := consultest.Start(t)
	client := a.Client()
	ctx := context.Background()
	const name = "sharelimit demand web node-a"
	dead := rawSession(t, client, &api.SessionEntry{Name: name, TTL: "60s", Behavior: api.SessionBehaviorDelete, LockDelay: time.Millisecond})
	fake := &Session{client: client}
	fake.set(dead)
	if _, err := NewPublisher(client, testKeys, "node-a", fake).Publish(ctx, []byte("stale")); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := client.KV().Acquire(&api.KVPair{Key: testKeys.Leader(), Value: []byte("node-a"), Session: dead}, nil); err != nil || !ok {
		t.Fatalf("the dead process's leader lock: %v %v", ok, err)
	}

	stale, _, err := client.KV().Get(testKeys.Report("node-a"), nil)
	if err != nil || stale == nil {
		t.Fatalf("the dead process's report: %+v %v", stale, err)
	}
	s, _ := runSession(t, client, name)
	pub := NewPublisher(client, testKeys, "node-a", s)
	if _, _, ok := pub.Adopted(); ok {
		t.Fatal("adopted a report before any write")
	}
	idx, err := pub.Publish(ctx, []byte("fresh"))
	if err != nil {
		t.Fatalf("the restarted process's first write: %v", err)
	}
	// The report the previous process left is handed over, once: a
	// division may have counted it, and this replica's share follows.
	if v, at, ok := pub.Adopted(); !ok || string(v) != "stale" || at != stale.ModifyIndex {
		t.Errorf("adopted %q at %d (%v), want %q at %d", v, at, ok, "stale", stale.ModifyIndex)
	}
	if _, _, ok := pub.Adopted(); ok {
		t.Error("adopted the previous report twice")
	}
	id, _ := s.ID()
	pair, _, err := client.KV().Get(testKeys.Report("node-a"), nil)
	if err != nil || pair == nil || string(pair.Value) != "fresh" || pair.Session != id || pair.ModifyIndex != idx {
		t.Fatalf("the report after the take-over: %+v (%v); want ours, at %d", pair, err, idx)
	}
	if info, _, _ := client.Session().Info(dead, nil); info != nil {
		t.Errorf("the previous process's session still exists")
	}
	if lock, _, _ := client.KV().Get(testKeys.Leader(), nil); lock != nil && lock.Session == dead {
		t.Errorf("the previous process's leader lock is still held")
	}

	// A key held by a session of another name is not taken.
	other := rawSession(t, client, &api.SessionEntry{Name: "someone else", TTL: "60s", Behavior: api.SessionBehaviorDelete})
	if ok, _, err := client.KV().Acquire(&api.KVPair{Key: testKeys.Report("node-b"), Value: []byte("theirs"), Session: other}, nil); err != nil || !ok {
		t.Fatalf("acquire for the other session: %v %v", ok, err)
	}
	if _, err := NewPublisher(client, testKeys, "node-b", s).Publish(ctx, []byte("ours")); !errors.Is(err, ErrRefused) {
		t.Errorf("a key held by a session of another name: %v, want ErrRefused", err)
	}
	if info, _, _ := client.Session().Info(other, nil); info == nil {
		t.Errorf("the session of another name was ended")
	}
}

// TestPublisherSessionGone: a write with a session destroyed behind its back
// is refused as ErrSessionGone, and the session is replaced at once rather
// than at its next renewal (TTL/2).
func TestPublisherSessionGone(t *testing.T) {
	a := consultest.Start(t)
	client := a.Client()
	s, _ := runSession(t, client, "gone")
	id, _ := s.ID()
	if _, err := client.Session().Destroy(id, nil); err != nil {
		t.Fatal(err)
	}
	_, err := NewPublisher(client, testKeys, "node-a", s).Publish(context.Background(), []byte("x"))
	if !errors.Is(err, ErrSessionGone) || !errors.Is(err, ErrRefused) {
		t.Fatalf("a write with a destroyed session: %v, want ErrSessionGone", err)
	}
	testutil.Eventually(t, MinTTL/2-time.Second, testutil.Cond(func() bool { nid, _ := s.ID(); return nid != "" && nid != id }, "a new session before the next renewal"))
}
