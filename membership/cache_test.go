package membership

import (
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/consultest"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// TestAgentCachedWatch runs the watch with its defaults through a counting
// proxy in front of a real agent: every query asks for the agent's cache,
// the agent answers from it (X-Cache), and the view still follows the
// catalog. With NoCache, no query asks for it.
func TestAgentCachedWatch(t *testing.T) {
	t.Parallel()
	a := consultest.Start(t)
	cachedProxy, plainProxy := newAgentProxy(t, a.Addr()), newAgentProxy(t, a.Addr())
	// A short grace: node-b failing drops out once it is over, which the
	// cached watch must see though the catalog does not change again.
	cfg := ConsulConfig{Service: "web", Node: "node-a", Stale: true, Grace: 500 * time.Millisecond}
	a.RegisterInstance("node-a", "web-a1", "web", true)
	a.RegisterInstance("node-b", "web-b1", "web", true)
	c := watch(t, cfg, newClient(t, cachedProxy.addr(), ""))
	cfg.NoCache = true
	plain := watch(t, cfg, newClient(t, plainProxy.addr(), ""))
	waitView(t, c, counts(2, 1), "two instances")
	waitView(t, plain, counts(2, 1), "two instances, without the cache")
	a.RegisterInstance("node-c", "web-c1", "web", true)
	waitView(t, c, counts(3, 1), "a third instance")
	a.SetCheck("node-b", "web-b1", false)
	v := waitView(t, c, counts(2, 1), "node-b failing, past the grace")
	waitView(t, plain, counts(2, 1), "node-b failing past the grace, without the cache")
	if v.LastError != "" || v.Errors != 0 {
		t.Fatalf("cached watch view = %+v; want no errors", v)
	}

	got := cachedProxy.served()
	hits, misses, blocking := 0, 0, 0
	for i, s := range got {
		if !s.cached() || s.status != http.StatusOK {
			t.Errorf("query %d: %v answered %d; want every query ?cached and answered", i, s.query, s.status)
		}
		switch s.xCache {
		case "HIT":
			hits++
		case "MISS":
			misses++
		default:
			t.Errorf("query %d: %v has no X-Cache header: the agent did not serve it from its cache", i, s.query)
		}
		if s.query.Has("index") {
			blocking++
		}
	}
	t.Logf("cached watch: %d queries (%d blocking), X-Cache HIT %d, MISS %d", len(got), blocking, hits, misses)
	if blocking < 2 {
		t.Errorf("only %d of %d cached queries block on an index: the index rules are lost with the cache", blocking, len(got))
	}
	for i, s := range plainProxy.served() {
		if s.cached() || s.xCache != "" {
			t.Errorf("NoCache query %d: %v answered with X-Cache %q; want plain queries", i, s.query, s.xCache)
		}
	}
}

// TestAgentCacheFallback runs the watch against an agent whose cached
// queries fail while plain ones work: a real misconfiguration, an agent
// using the streaming backend against servers with streaming off. The watch
// must notice, fall back to plain queries, and follow the catalog.
func TestAgentCacheFallback(t *testing.T) {
	t.Parallel()
	a := consultest.Start(t, consultest.WithArgs("-hcl", `rpc { enable_streaming = false }`))
	p := newAgentProxy(t, a.Addr())
	a.RegisterInstance("node-a", "web-a1", "web", true)
	a.RegisterInstance("node-b", "web-b1", "web", true)
	var logs logBuffer
	c := watch(t, fast(ConsulConfig{Logger: logs.logger()}), newClient(t, p.addr(), ""))
	waitView(t, c, counts(2, 1), "two instances")
	a.RegisterInstance("node-c", "web-c1", "web", true)
	waitView(t, c, counts(3, 1), "a third instance")

	got := p.served()
	if len(got) < 2 || !got[0].cached() || got[0].status == http.StatusOK {
		t.Fatalf("first queries %+v; want a ?cached query the agent fails", got)
	}
	// cacheStrikes times, a cached query fails and a plain one answers; then
	// only plain queries until the retry period ends. This agent fails its
	// cached queries both ways judgeCache knows: 500 at once, or, once the
	// streaming view exists, an empty list when the wait ends.
	lastCached, cached := -1, 0
	for i, s := range got {
		if s.cached() {
			lastCached = i
			cached++
		}
	}
	if cached != cacheStrikes || lastCached != 2*cacheStrikes-2 || len(got) <= lastCached+1 {
		t.Fatalf("%d queries, %d cached, the last at %d: want %d strikes, each a failed cached query and an answered plain one, then plain queries:\n%+v",
			len(got), cached, lastCached, cacheStrikes, got)
	}
	for i, s := range got[:lastCached+2] {
		if s.cached() != (i%2 == 0) {
			t.Errorf("query %d: %v; want cached and plain queries in turn", i, s.query)
		}
		t.Logf("query %d: cached %v, index %q: HTTP %d, X-Cache %q, %d bytes", i, s.cached(), s.query.Get("index"), s.status, s.xCache, s.bytes)
	}
	if out := logs.String(); !strings.Contains(out, "level=WARN") || !strings.Contains(out, "plain") {
		t.Errorf("the fall back was not logged at warn:\n%s", out)
	}
	// On this agent a plain query that blocks on an index goes to the
	// streaming backend too, and fails: the watch lives on the non-blocking
	// query after each failure. That is the agent's misconfiguration, with
	// or without the cache.
	fellBack := lastCached + 1
	t.Logf("%d cached queries failed before the fall back; %d plain queries after; %d errors counted",
		cacheStrikes, len(got)-fellBack, c.View().Errors)
}

// TestAgentCacheDisabled runs the watch against an agent with its HTTP
// cache off: it ignores ?cached and answers plain queries, without cache
// headers. That needs no fall back: the watch works as it would without
// the cache, and nothing is reported as failing.
func TestAgentCacheDisabled(t *testing.T) {
	t.Parallel()
	a := consultest.Start(t, consultest.WithArgs("-hcl", `http_config { use_cache = false }`))
	p := newAgentProxy(t, a.Addr())
	a.RegisterInstance("node-a", "web-a1", "web", true)
	a.RegisterInstance("node-b", "web-b1", "web", true)
	var logs logBuffer
	c := watch(t, ConsulConfig{Service: "web", Node: "node-a", Logger: logs.logger(), Grace: time.Second}, newClient(t, p.addr(), ""))
	waitView(t, c, counts(2, 1), "two instances")
	a.Deregister("node-b", "web-b1")
	v := waitView(t, c, counts(1, 1), "node-b gone, past its grace")
	got := p.served()
	for i, s := range got {
		if !s.cached() || s.xCache != "" || s.status != http.StatusOK {
			t.Errorf("query %d: %v answered %d with X-Cache %q; want ?cached, answered plainly", i, s.query, s.status, s.xCache)
		}
	}
	if v.Errors != 0 || strings.Contains(logs.String(), "level=WARN") {
		t.Errorf("view %+v, logs:\n%s\nwant no error and no warning", v, logs.String())
	}
}

// TestFakeCacheRetry covers what a real agent cannot be made to do on
// demand: a cache that fails and later works again. After a fall back the
// watch asks for the cache again once the retry period has passed, stays
// with plain queries while the cache still fails, and keeps the cache once
// it answers.
func TestFakeCacheRetry(t *testing.T) {
	t.Parallel()
	var cacheWorks atomic.Bool
	f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
		cached := r.URL.Query().Has("cached")
		if cached && !cacheWorks.Load() {
			http.Error(w, "Unexpected response code: 500 (rpc error: code = Unimplemented)", http.StatusInternalServerError)
			return
		}
		if r.URL.Query().Has("index") {
			hold(r, 20*time.Millisecond)
		}
		if cached {
			w.Header().Set("X-Cache", "HIT")
			w.Header().Set("Age", "0")
		}
		reply(w, 10, entries("node-a", "node-b"))
	})
	var logs logBuffer
	c, err := NewConsul(fast(ConsulConfig{Logger: logs.logger()}), newClient(t, f.addr(), ""))
	if err != nil {
		t.Fatal(err)
	}
	const retry = 300 * time.Millisecond
	c.cacheRetry = retry
	run(t, c)
	waitView(t, c, counts(2, 1), "two instances")

	cachedAfter := func(from int) int {
		n := 0
		for _, r := range f.requests()[from:] {
			if r.query.Has("cached") {
				n++
			}
		}
		return n
	}
	// Fell back; after the retry period the cache is asked again, fails,
	// and the watch goes back to plain queries.
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return cachedAfter(0) >= 2*cacheStrikes }, "a fall back and a retry of the cache"))
	start := time.Now()
	mark := f.count()
	time.Sleep(retry / 2)
	if n := cachedAfter(mark); n > cacheStrikes {
		t.Fatalf("%d cached queries within %s; want at most one retry (%d) per %s", n, time.Since(start), cacheStrikes, retry)
	}
	cacheWorks.Store(true)
	mark = f.count()
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return cachedAfter(mark) >= 1 }, "the next retry of the cache"))
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return f.count() >= mark+20 }, "twenty more queries"))
	reqs := f.requests()[mark:]
	retried := 0
	for !reqs[retried].query.Has("cached") {
		retried++
	}
	for i, r := range reqs[retried:] {
		if !r.query.Has("cached") {
			t.Fatalf("query %d, after the cache answered again, is plain: %v", mark+retried+i, r.query)
		}
	}
	if v := c.View(); !counts(2, 1)(v) {
		t.Fatalf("view = %+v", v)
	}
	if out := logs.String(); !strings.Contains(out, "cache answers again") {
		t.Errorf("recovery not logged:\n%s", out)
	}
}

// TestFakeCacheAge checks that a cached answer is dated by its Age: the
// servers confirmed it that long ago, so ObservedAt (and the age the daemon
// exports) tells the truth while the agent serves from a cache it cannot
// refresh.
func TestFakeCacheAge(t *testing.T) {
	t.Parallel()
	f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
		if n > 0 {
			hold(r, time.Minute)
		}
		// The api client reads the cache headers only after
		// X-Consul-LastContact, which every agent sends.
		w.Header().Set("X-Consul-LastContact", "0")
		w.Header().Set("X-Cache", "HIT")
		w.Header().Set("Age", "30")
		reply(w, 10, entries("node-a", "node-b"))
	})
	start := time.Now()
	c := watch(t, fast(ConsulConfig{}), newClient(t, f.addr(), ""))
	v := waitView(t, c, counts(2, 1), "two instances")
	if age := start.Sub(v.ObservedAt); age < 29*time.Second || age > 31*time.Second {
		t.Fatalf("ObservedAt = %s, %s before the watch started; want it dated 30 s back by the Age header", v.ObservedAt, age)
	}
}

// TestFakeCacheNotBlamedForOutage models an agent that answers every query
// 500 for a while (a restart before its leader is known) and recovers just
// before the watch's plain probe: the plain query answers, but the cache was
// never at fault, and the watch must keep using it.
func TestFakeCacheNotBlamedForOutage(t *testing.T) {
	t.Parallel()
	var recovered atomic.Bool
	f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
		cached := r.URL.Query().Has("cached")
		if n > 0 && !cached {
			recovered.Store(true) // just in time for the plain probe
		}
		if n > 0 && !recovered.Load() {
			http.Error(w, "No cluster leader", http.StatusInternalServerError)
			return
		}
		if r.URL.Query().Has("index") {
			hold(r, 10*time.Millisecond)
		}
		reply(w, uint64(10+n), entries("node-a", "node-b"))
	})
	var logs logBuffer
	c := watch(t, fast(ConsulConfig{Logger: logs.logger()}), newClient(t, f.addr(), ""))
	waitView(t, c, func(v View) bool { return v.Errors >= 1 }, "the outage")
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return f.count() >= 20 }, "twenty queries"))
	reqs := f.requests()
	plain := 0
	for _, r := range reqs {
		if !r.query.Has("cached") {
			plain++
		}
	}
	if plain != 1 || !reqs[len(reqs)-1].query.Has("cached") {
		t.Fatalf("%d plain queries among %d, the last %v; want one plain probe, then the cache kept", plain, len(reqs), reqs[len(reqs)-1].query)
	}
	if strings.Contains(logs.String(), "cannot serve cached") {
		t.Fatalf("the cache was blamed for the outage:\n%s", logs.String())
	}
}

// TestFakeCacheOlderAnswer models an agent whose cache stopped following
// the servers (its subscription died) while plain queries still reach them:
// a cached query fails, the plain probe reads 4 instances, and the next
// cached query answers what the cache last knew, 2 instances, dated 30 s
// back by its Age. That answer is older than the view in force and looser:
// it must never be published, and the cache takes the blame.
func TestFakeCacheOlderAnswer(t *testing.T) {
	t.Parallel()
	f := newFake(t, func(n int, w http.ResponseWriter, r *http.Request) {
		cached := r.URL.Query().Has("cached")
		if r.URL.Query().Has("index") {
			hold(r, 10*time.Millisecond)
		}
		w.Header().Set("X-Consul-LastContact", "0")
		switch {
		case n == 0:
			w.Header().Set("X-Cache", "MISS")
			reply(w, 10, entries("node-a", "node-b", "node-c"))
		case n == 1:
			http.Error(w, "rpc error: code = Unimplemented", http.StatusInternalServerError)
		case cached:
			w.Header().Set("X-Cache", "HIT")
			w.Header().Set("Age", "30")
			reply(w, 10, entries("node-a", "node-b"))
		default:
			reply(w, 20, entries("node-a", "node-b", "node-c", "node-d"))
		}
	})
	var (
		mu       sync.Mutex
		sawTruth bool
		worst    float64
	)
	var logs logBuffer
	c := watch(t, fast(ConsulConfig{Logger: logs.logger(), OnUpdate: func(v View) {
		mu.Lock()
		defer mu.Unlock()
		if v.Total == 4 {
			sawTruth = true
		}
		if sawTruth {
			worst = max(worst, v.Weight)
		}
	}}), newClient(t, f.addr(), ""))
	waitView(t, c, counts(4, 1), "the plain probe's four instances")
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return f.count() >= 12 }, "a dozen queries"))
	mu.Lock()
	defer mu.Unlock()
	if worst > 0.25 {
		t.Fatalf("after the servers said 1/4, weight %v was published from an older cached answer", worst)
	}
	if v := c.View(); !counts(4, 1)(v) {
		t.Fatalf("view = %+v, want 4 instances", v)
	}
	if !strings.Contains(logs.String(), "cannot serve cached") {
		t.Errorf("the cache was not blamed for its older answers:\n%s", logs.String())
	}
}
