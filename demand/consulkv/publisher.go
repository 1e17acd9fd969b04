package consulkv

import (
	"context"
	"errors"
	"fmt"

	"github.com/hashicorp/consul/api"
)

// ErrRefused marks a write Consul refused as a whole (a transaction that
// failed): nothing was written. Another session still holding the key (a
// previous process of the same node, until its session expires) is one cause.
var ErrRefused = errors.New("consulkv: write refused")

// Publisher writes one replica's report, held by its session.
type Publisher struct {
	client *api.Client
	key    string
	s      *Session
}

// NewPublisher returns a publisher of node's report.
func NewPublisher(client *api.Client, keys Keys, node string, s *Session) *Publisher {
	return &Publisher{client: client, key: keys.Report(node), s: s}
}

// Publish writes value and returns the index Consul gave the write. The
// write takes the key's lock with the session, so the key goes when the
// session does.
func (p *Publisher) Publish(ctx context.Context, value []byte) (uint64, error) {
	id, _ := p.s.ID()
	if id == "" {
		return 0, ErrNoSession
	}
	ok, resp, _, err := p.client.Txn().Txn(api.TxnOps{
		{KV: &api.KVTxnOp{Verb: api.KVLock, Key: p.key, Value: value, Session: id}},
	}, (&api.QueryOptions{}).WithContext(ctx))
	if err != nil {
		return 0, fmt.Errorf("write %s: %w", p.key, err)
	}
	if !ok || len(resp.Results) != 1 || resp.Results[0].KV == nil {
		var msg string
		if resp != nil && len(resp.Errors) > 0 {
			msg = resp.Errors[0].What
		}
		return 0, fmt.Errorf("%w: %s: %s", ErrRefused, p.key, msg)
	}
	return resp.Results[0].KV.ModifyIndex, nil
}
