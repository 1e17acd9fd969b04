package membership

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"
)

// Defaults for the zero fields of ConsulConfig.
const (
	// DefaultQueryRate is the sustained number of catalog requests per second
	// one replica may make. A blocking query returns as soon as the catalog
	// changes, so without pacing a catalog that changes 100 times a second would
	// cost every replica 100 requests a second. At 2/s a count change still
	// reaches the view within half a second even under constant churn, and a
	// thousand replicas cost Consul at most 2,000 stale reads a second while
	// the catalog churns and about 17 a second while it is quiet.
	DefaultQueryRate = 2.0
	// DefaultQueryBurst is how many requests may go back to back after a quiet
	// spell, so the first few changes of a rolling restart propagate at once.
	DefaultQueryBurst = 3
	// DefaultWaitTime is how long Consul holds a blocking query open when
	// nothing changes. It is shorter than Consul's own 5-minute default so that
	// a healthy watch confirms its view (and so refreshes ObservedAt) at least
	// once a minute, and a connection silently dropped by a middlebox is noticed
	// within about a minute.
	DefaultWaitTime = time.Minute
	// DefaultBackoffBase and DefaultBackoffMax shape the wait after a failed
	// request: full jitter over an exponential ceiling (0.5 s, 1 s, 2 s, ...,
	// 30 s), reset by the next success.
	DefaultBackoffBase = 500 * time.Millisecond
	DefaultBackoffMax  = 30 * time.Second
	// DefaultMaxInstances is the largest passing-instance count believed. A
	// larger answer (a mistyped filter matching every service, a misbehaving
	// proxy) would shrink every share to almost nothing, so it is treated as an
	// error and the last view stands.
	DefaultMaxInstances = 10_000
	// DefaultGrace is how long an instance counts after it was last seen
	// passing (or first seen): see roster. It outlasts a newcomer's first
	// checks and a check that flaps, and costs a replica that really died
	// this long at its share before its peers take it over.
	DefaultGrace = 30 * time.Second

	// cacheRetry is how long the watch sends plain queries after finding
	// that the agent cannot serve cached ones, before it tries again: long
	// enough that a misconfigured agent costs one failed query in ten
	// minutes, short enough that a fixed one is used again soon.
	cacheRetry = 10 * time.Minute
	// cacheStrikes is how many cached queries must fail, each followed by a
	// plain query that answered, before the watch stops asking for the cache.
	cacheStrikes = 2

	// requestSlack is added to a blocking query's wait, on top of the up to
	// wait/16 that Consul adds itself, before the client gives up on it.
	requestSlack = 5 * time.Second
	// maxWaitTime is Consul's own cap on a blocking query's wait.
	maxWaitTime = 10 * time.Minute
)

// ConsulConfig configures a Consul source. The zero value of every field but
// Service is usable; the daemon sets Stale.
type ConsulConfig struct {
	Service    string // --consul-service: the service whose passing instances share each limit
	Filter     string // --consul-filter: a Consul filter expression applied to the entries
	Datacenter string // --consul-datacenter: "" is the agent's own datacenter
	// Node is the Consul node whose instances are this replica's (--node). ""
	// means the local agent's node name, read from /v1/agent/self (which needs
	// agent:read); until it answers, the Replicas view stands.
	Node string
	// Stale allows any Consul server to answer, not only the leader, so the
	// count survives the loss of a leader (--consul-stale).
	Stale bool
	// Initial, when set, is the view that stands until Consul first answers
	// instead of the Replicas one: the view a restarted daemon saved
	// (--state-file), so it does not enforce a whole limit meanwhile. One
	// that is not a possible view is ignored.
	Initial *View
	// Replicas is the replica count assumed until Consul first answers
	// (--replicas); below 1 means 1.
	Replicas int
	// QueryRate caps requests to Consul per second, sustained (a token bucket
	// of QueryBurst tokens). Default DefaultQueryRate.
	QueryRate float64
	// QueryBurst is the token bucket's size. Default DefaultQueryBurst.
	QueryBurst int
	// WaitTime is how long Consul may hold a blocking query open; at most 10
	// minutes. Default DefaultWaitTime.
	WaitTime time.Duration
	// RequestTimeout is the client-side deadline of every request, so a server
	// that never answers cannot wedge the watch. It must exceed WaitTime plus
	// the WaitTime/16 of jitter Consul adds. Default WaitTime + WaitTime/16 + 5 s.
	RequestTimeout time.Duration
	// BackoffBase and BackoffMax shape the wait after an error: a random
	// duration in [0, min(BackoffMax, BackoffBase·2^n)) after the n-th
	// consecutive failure. Defaults DefaultBackoffBase and DefaultBackoffMax.
	BackoffBase time.Duration
	BackoffMax  time.Duration
	// Grace is how long an instance that is not listed passing still counts
	// after it was last seen passing, or first seen (--membership-grace):
	// see roster. 0 means DefaultGrace; a negative grace counts only the
	// instances listed passing.
	Grace time.Duration
	// MaxInstances is the largest passing-instance count accepted; a larger
	// answer is an error and the last view stands. Default DefaultMaxInstances.
	MaxInstances int
	// IgnoreWeights counts every passing instance as 1, whatever the
	// Weights.Passing it is registered with. By default (false) shares are
	// weight-proportional: this node's summed weight over the cluster's.
	// The field is a negative so that its zero value is the default.
	IgnoreWeights bool
	// NoCache sends plain blocking queries. By default (false) the watch
	// asks with ?cached, so the agent's cache (or its streaming backend)
	// answers it, and falls back to plain queries where that fails. The
	// field is a negative so that its zero value is the default.
	NoCache bool
	// Token is the ACL token the client sends, if any. It is used only to scrub
	// the token from error messages and logs, should a server or proxy echo it
	// back. api.NewClient stores the token it resolved (CONSUL_HTTP_TOKEN or
	// CONSUL_HTTP_TOKEN_FILE) in the api.Config it was given, so pass that
	// config's Token after creating the client.
	Token string
	// Logger receives view changes at info, errors at warn and every poll at
	// debug. The caller tags it (component=membership). nil discards.
	Logger *slog.Logger
	// OnUpdate, if set, receives every published View, from Run's goroutine:
	// after every answer from Consul (at most QueryRate a second, and at least
	// once per WaitTime while Consul is healthy) and after every failure. It
	// must return quickly; compare Weight to act only on changes.
	OnUpdate func(View)
	// Clock stamps ObservedAt. nil means time.Now. Pacing and back-off always
	// use real timers.
	Clock func() time.Time
}

// normalize checks cfg and fills in defaults, reporting every problem at once.
func (cfg *ConsulConfig) normalize() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if cfg.Service == "" {
		bad("service name is empty")
	}
	if cfg.QueryRate < 0 || math.IsNaN(cfg.QueryRate) || math.IsInf(cfg.QueryRate, 0) {
		bad("query rate %v is not a finite positive number", cfg.QueryRate)
	}
	if cfg.QueryBurst < 0 {
		bad("query burst %d is negative", cfg.QueryBurst)
	}
	if cfg.WaitTime < 0 || cfg.WaitTime > maxWaitTime {
		bad("wait time %s is outside (0, %s]", cfg.WaitTime, maxWaitTime)
	}
	if cfg.RequestTimeout < 0 {
		bad("request timeout %s is negative", cfg.RequestTimeout)
	}
	if cfg.BackoffBase < 0 || cfg.BackoffMax < 0 {
		bad("back-off %s..%s is negative", cfg.BackoffBase, cfg.BackoffMax)
	}
	if cfg.MaxInstances < 0 {
		bad("max instances %d is negative", cfg.MaxInstances)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}

	if cfg.QueryRate == 0 {
		cfg.QueryRate = DefaultQueryRate
	}
	switch {
	case cfg.Grace == 0:
		cfg.Grace = DefaultGrace
	case cfg.Grace < 0:
		cfg.Grace = 0
	}
	if cfg.QueryBurst == 0 {
		cfg.QueryBurst = DefaultQueryBurst
	}
	if cfg.WaitTime == 0 {
		cfg.WaitTime = DefaultWaitTime
	}
	// Consul holds a blocking query for up to wait + wait/16.
	held := cfg.WaitTime + cfg.WaitTime/16
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = held + requestSlack
	} else if cfg.RequestTimeout <= held {
		return fmt.Errorf("request timeout %s does not exceed the %s Consul may hold a blocking query", cfg.RequestTimeout, held)
	}
	if cfg.BackoffBase == 0 {
		cfg.BackoffBase = DefaultBackoffBase
	}
	if cfg.BackoffMax == 0 {
		cfg.BackoffMax = max(DefaultBackoffMax, cfg.BackoffBase)
	}
	if cfg.BackoffMax < cfg.BackoffBase {
		return fmt.Errorf("back-off max %s is below its base %s", cfg.BackoffMax, cfg.BackoffBase)
	}
	if cfg.MaxInstances == 0 {
		cfg.MaxInstances = DefaultMaxInstances
	}
	return nil
}
