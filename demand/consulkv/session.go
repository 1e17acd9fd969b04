package consulkv

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// MinTTL is Consul's shortest session TTL.
const MinTTL = 10 * time.Second

// SessionConfig configures a Session.
type SessionConfig struct {
	Name string
	// TTL is the session's time to live, at least MinTTL; it is renewed
	// every TTL/2. Consul may take up to twice the TTL to expire it.
	TTL time.Duration
	// Linger leaves the session to expire by its TTL when Run ends, rather
	// than destroying it, and so the report it holds: a replica whose
	// Envoys may still enforce the share that report got keeps it counted,
	// and its next process takes the key over (Publisher.Adopted).
	Linger bool
	Logger *slog.Logger
}

// Session is a Consul session with a TTL and no checks, behaviour delete,
// renewed in the background. When a renewal finds it gone (expired while the
// agent was unreachable, or destroyed), Run makes a new one and bumps the
// generation, so holders know their locks went with the old one. Safe for
// concurrent use.
type Session struct {
	client *api.Client
	cfg    SessionConfig
	log    *slog.Logger

	mu      sync.Mutex
	id      string
	gen     uint64
	renewed time.Time // the last successful create or renewal
	// check wakes Run to renew at once: a write found the session gone.
	check chan struct{}
}

// NewSession returns a session that Run creates and keeps.
func NewSession(client *api.Client, cfg SessionConfig) (*Session, error) {
	if client == nil {
		return nil, fmt.Errorf("consulkv session: nil client")
	}
	if cfg.TTL < MinTTL || cfg.TTL > 24*time.Hour {
		return nil, fmt.Errorf("consulkv session: TTL %s is not between %s and 24h", cfg.TTL, MinTTL)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Session{client: client, cfg: cfg, log: log, check: make(chan struct{}, 1)}, nil
}

// Name is the session's name in Consul: a later process of the same
// replica uses the same one, which is how it knows its predecessor's.
func (s *Session) Name() string { return s.cfg.Name }

// Check asks Run to renew now rather than at its next turn: a write was
// refused as if the session were gone, and if it is, a new one is made at
// once instead of up to TTL/2 later.
func (s *Session) Check() {
	select {
	case s.check <- struct{}{}:
	default:
	}
}

// ID is the session's ID ("" while there is none) and its generation, which
// grows by one with every new session.
func (s *Session) ID() (id string, gen uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.id, s.gen
}

func (s *Session) set(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id != "" {
		s.gen++
	}
	s.id = id
}

// Renewed is when the session was last created or renewed: Consul expires it
// no sooner than its TTL after that.
func (s *Session) Renewed() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.renewed
}

func (s *Session) touch() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.renewed = time.Now()
}

// Run creates the session and renews it until ctx ends, then destroys it
// (best effort, within two seconds), which deletes the keys it held; a
// lingering session is left to expire instead.
func (s *Session) Run(ctx context.Context) error {
	errs := 0
	for {
		id, _ := s.ID()
		var err error
		wait := s.cfg.TTL / 2
		if id == "" {
			id, _, err = s.client.Session().CreateNoChecks(&api.SessionEntry{
				Name: s.cfg.Name, TTL: s.cfg.TTL.String(), Behavior: api.SessionBehaviorDelete,
				// Consul holds a lock its dead holder had for the lock
				// delay (15 s by default); the shortest it takes lets
				// the next leader take over at once.
				LockDelay: time.Millisecond,
			}, (&api.WriteOptions{}).WithContext(ctx))
			if err == nil {
				s.set(id)
				s.touch()
				s.log.Info("consul session created", "session", id, "ttl", s.cfg.TTL)
			}
		} else {
			var entry *api.SessionEntry
			entry, _, err = s.client.Session().Renew(id, (&api.WriteOptions{}).WithContext(ctx))
			switch {
			case err == nil && entry == nil:
				s.log.Warn("consul session gone; making a new one", "session", id)
				s.set("")
				wait = 0
			case err == nil:
				s.touch()
			}
		}
		if ctx.Err() != nil {
			s.destroy()
			return nil
		}
		if err != nil {
			errs++
			wait = min(wait, backoff(errs))
			s.log.Warn("consul session", "err", err, "retry_in", wait)
		} else {
			errs = 0
		}
		if !s.wait(ctx.Done(), wait) {
			s.destroy()
			return nil
		}
	}
}

// wait is sleep that Check cuts short.
func (s *Session) wait(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return false
	case <-t.C:
	case <-s.check:
	}
	return true
}

func (s *Session) destroy() {
	id, _ := s.ID()
	if id == "" {
		return
	}
	if s.cfg.Linger {
		s.log.Info("consul session left to expire by its TTL, with the report it holds", "session", id, "ttl", s.cfg.TTL)
		s.set("")
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := s.client.Session().Destroy(id, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		s.log.Warn("consul session not destroyed; it expires by its TTL", "session", id, "err", err)
	}
	s.set("")
}
