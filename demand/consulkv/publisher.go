package consulkv

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
)

// ErrRefused marks a write Consul refused as a whole (a transaction that
// failed): nothing was written. ErrHeld and ErrSessionGone, which wrap it,
// name the two causes known.
var ErrRefused = errors.New("consulkv: write refused")

// ErrHeld: another session holds the key, one that is not a previous
// process of this replica's (or one that was, after the publisher already
// took a key over once).
var ErrHeld = fmt.Errorf("%w: the key is held by another session", ErrRefused)

// ErrSessionGone: the session the write was made with no longer exists
// (destroyed, or expired while Consul was out of reach); Session.Run is
// told to make a new one.
var ErrSessionGone = fmt.Errorf("%w: the session is gone", ErrRefused)

// Publisher writes one replica's report, held by its session. Not safe for
// concurrent use.
type Publisher struct {
	client *api.Client
	key    string
	s      *Session
	// tookOver: this publisher has ended a previous process's session
	// once. It does so at most once, so that two live processes given
	// the same node name cannot end each other's sessions in turn: the
	// second is refused, loudly, and keeps at most its equal share.
	tookOver bool

	mu sync.Mutex
	// adopted is the report the previous process's session held when this
	// publisher ended it, until Adopted hands it over.
	adopted *KVReport
}

// Adopted returns, once, the report a previous process of this replica
// held under the key when this publisher took it over: its value and the
// index it was written at. A division may have counted it, and the replica
// reads its share from the report a division counted.
func (p *Publisher) Adopted() (value []byte, index uint64, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.adopted == nil {
		return nil, 0, false
	}
	r := p.adopted
	p.adopted = nil
	return r.Value, r.ModifyIndex, true
}

// NewPublisher returns a publisher of node's report.
func NewPublisher(client *api.Client, keys Keys, node string, s *Session) *Publisher {
	return &Publisher{client: client, key: keys.Report(node), s: s}
}

// Publish writes value and returns the index Consul gave the write. The
// write takes the key's lock with the session, so the key goes when the
// session does.
//
// A key held by a session of the same name (a previous process of this
// replica, killed before its session expired: its report would stand,
// unchangeable, for up to twice the TTL) is taken over: that session is
// ended, which deletes what it held, and the write is made again, once per
// publisher. The leader's parameters list the reports they counted by the
// index of their write, so the previous process's report never counts as
// this one's, before or after (History.Reported).
func (p *Publisher) Publish(ctx context.Context, value []byte) (uint64, error) {
	id, _ := p.s.ID()
	if id == "" {
		return 0, ErrNoSession
	}
	index, msg, err := p.lock(ctx, id, value)
	if err != nil || msg == "" {
		return index, err
	}
	refused := p.refused(ctx, id, msg)
	if !errors.Is(refused, errTakenOver) {
		return 0, refused
	}
	// The ended session's lock delay (a millisecond for the sessions this
	// package makes) may still be running.
	for wait := 10 * time.Millisecond; ; wait *= 2 {
		if index, msg, err = p.lock(ctx, id, value); err != nil || msg == "" {
			return index, err
		}
		if !strings.Contains(msg, "lock delay") || wait > time.Second || !sleep(ctx.Done(), wait) {
			return 0, fmt.Errorf("%w: %s: %s", ErrRefused, p.key, msg)
		}
	}
}

// errTakenOver: refused only ended a previous process's session; the
// write may be made again.
var errTakenOver = errors.New("taken over")

// lock writes value with the key's lock: the index, or msg when Consul
// refused the transaction.
func (p *Publisher) lock(ctx context.Context, id string, value []byte) (index uint64, msg string, err error) {
	ok, resp, _, err := p.client.Txn().Txn(api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: p.key, Value: value, Session: id}},
	}, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return 0, "", fmt.Errorf("write %s: %w", p.key, err)
	}
	if !ok || len(resp.Results) != 1 || resp.Results[0].KV == nil {
		msg = "refused"
		if resp != nil && len(resp.Errors) > 0 {
			msg = resp.Errors[0].What
		}
		return 0, msg, nil
	}
	return resp.Results[0].KV.ModifyIndex, "", nil
}

// refused finds why a write with session id was refused: the key held by
// a previous process's session (ended: errTakenOver), by another session
// (ErrHeld), or this session gone (ErrSessionGone, and Run is told).
func (p *Publisher) refused(ctx context.Context, id, msg string) error {
	q := (&api.QueryOptions{}).WithContext(ctx)
	if mine, _, err := p.client.Session().Info(id, q); err == nil && mine == nil {
		p.s.Check()
		return fmt.Errorf("%w: %s: session %s: %s", ErrSessionGone, p.key, id, msg)
	}
	pair, _, err := p.client.KV().Get(p.key, q)
	if err != nil {
		return fmt.Errorf("%w: %s: %s (and reading the key: %v)", ErrRefused, p.key, msg, err)
	}
	if pair == nil || pair.Session == "" || pair.Session == id {
		return fmt.Errorf("%w: %s: %s", ErrRefused, p.key, msg)
	}
	holder, _, err := p.client.Session().Info(pair.Session, q)
	if err != nil {
		return fmt.Errorf("%w: %s: held by session %s (its name unknown: %v)", ErrHeld, p.key, pair.Session, err)
	}
	if holder == nil {
		// Gone since: the key went with it, and the next write finds it free.
		return fmt.Errorf("%w: %s: held by session %s, since ended", ErrRefused, p.key, pair.Session)
	}
	if holder.Name != p.s.Name() || p.tookOver {
		return fmt.Errorf("%w: %s: held by session %s (%q), not this process's", ErrHeld, p.key, holder.ID, holder.Name)
	}
	if _, err := p.client.Session().Destroy(holder.ID, (&api.WriteOptions{}).WithContext(ctx)); err != nil {
		return fmt.Errorf("%w: %s: held by a previous process's session %s, which could not be ended: %v", ErrHeld, p.key, holder.ID, err)
	}
	p.tookOver = true
	p.mu.Lock()
	p.adopted = &KVReport{Value: pair.Value, ModifyIndex: pair.ModifyIndex, Session: pair.Session}
	p.mu.Unlock()
	log := p.s.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log.Warn("ended the session of a previous process of this replica, which still held its demand report",
		"key", p.key, "session", holder.ID, "name", holder.Name)
	return errTakenOver
}
