package rlqs

import (
	"cmp"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// maxListed bounds the buckets a snapshot lists, the largest shares first.
const maxListed = 100

// Snapshot is what the pages show of the service. A value; nothing in it is
// shared with the service.
type Snapshot struct {
	Streams    []StreamInfo `json:"streams"`
	IDs        int          `json:"bucket_ids"`
	MaxBuckets int          `json:"max_buckets"`
	Shares     int          `json:"shares"`
	// Buckets are the shares with the largest budgets, at most 100; Unlisted
	// counts the rest.
	Buckets  []BucketInfo      `json:"buckets"`
	Unlisted int               `json:"unlisted,omitempty"`
	Reports  uint64            `json:"reports"`
	Pushes   uint64            `json:"pushes"`
	Refusals map[string]uint64 `json:"refusals,omitempty"`
	// ShadowMode: every assignment is ALLOW_ALL; the parts are what the
	// streams would have had.
	ShadowMode bool `json:"shadow_mode,omitempty"`
}

// StreamInfo is one open stream.
type StreamInfo struct {
	ID         uint64  `json:"id"`
	Peer       string  `json:"peer,omitempty"`
	Domain     string  `json:"domain"`
	Buckets    int     `json:"buckets"`
	Reports    uint64  `json:"reports"`
	AgeSeconds float64 `json:"age_seconds"`
}

// BucketInfo is one share: the replica's share of a bucket key and what it
// is divided into.
type BucketInfo struct {
	Domain string `json:"domain"`
	Rule   string `json:"rule"`
	// IDs are the bucket ids that map to the key (at most 8 shown).
	IDs        []string `json:"ids"`
	ShareRate  float64  `json:"share_rate_per_second"`
	ShareBurst float64  `json:"share_burst"`
	// AssignedRate and AssignedBurst sum every part below: never above the
	// share, but for what ended streams still hold when the share shrank.
	AssignedRate  float64        `json:"assigned_rate_per_second"`
	AssignedBurst float64        `json:"assigned_burst"`
	Parts         []ConsumerInfo `json:"parts"`
}

// ConsumerInfo is one part of a share: a stream's (Stream > 0), RLS's
// (Stream 0, ID "rls"), or what an ended stream may still enforce (Ended).
type ConsumerInfo struct {
	Stream uint64  `json:"stream,omitempty"`
	ID     string  `json:"id"`
	Rate   float64 `json:"rate_per_second"`
	Burst  float64 `json:"burst"`
	Demand float64 `json:"demand_per_second"`
	Ended  bool    `json:"ended,omitempty"`
}

// Snapshot copies what the pages show.
func (s *Service) Snapshot() Snapshot {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.opt.Clock()
	snap := Snapshot{IDs: len(s.ids), MaxBuckets: s.opt.MaxBuckets, Shares: len(s.shares),
		Reports: s.reports.Load(), Pushes: s.pushes.Load(), Refusals: s.refusalCounts(), ShadowMode: s.opt.ShadowMode}
	for _, st := range s.streams {
		snap.Streams = append(snap.Streams, StreamInfo{ID: st.id, Peer: st.peer, Domain: st.domain,
			Buckets: len(st.consumers), Reports: st.reports, AgeSeconds: float64(now-st.opened) / 1e9})
	}
	slices.SortFunc(snap.Streams, func(a, b StreamInfo) int { return cmp.Compare(a.ID, b.ID) })
	shares := make([]*share, 0, len(s.shares))
	for _, sh := range s.shares {
		shares = append(shares, sh)
	}
	slices.SortFunc(shares, func(a, b *share) int {
		return cmp.Or(cmp.Compare(b.budget.Rate, a.budget.Rate), cmp.Compare(a.key.domain, b.key.domain), cmp.Compare(a.key.key, b.key.key))
	})
	if len(shares) > maxListed {
		snap.Unlisted = len(shares) - maxListed
		shares = shares[:maxListed]
	}
	for _, sh := range shares {
		snap.Buckets = append(snap.Buckets, bucketInfo(sh, now))
	}
	return snap
}

func (s *Service) refusalCounts() map[string]uint64 {
	m := map[string]uint64{}
	for i := range s.refusals {
		if n := s.refusals[i].Load(); n > 0 {
			m[reasonNames[i]] = n
		}
	}
	return m
}

func bucketInfo(sh *share, now int64) BucketInfo {
	b := BucketInfo{Domain: sh.key.domain, Rule: sh.target.Rule, ShareRate: sh.budget.Rate, ShareBurst: sh.budget.Burst,
		AssignedRate: sh.assigned.Rate, AssignedBurst: sh.assigned.Burst}
	for e := range sh.entries {
		name := idString(e.id)
		if len(b.IDs) < 8 {
			b.IDs = append(b.IDs, name)
		}
		for _, c := range e.consumers {
			b.Parts = append(b.Parts, ConsumerInfo{Stream: c.st.id, ID: name, Rate: c.part.cur.Rate, Burst: c.part.cur.Burst, Demand: c.demand})
		}
		for _, r := range e.reserved {
			if r.until > now {
				b.Parts = append(b.Parts, ConsumerInfo{ID: name, Rate: r.part.Rate, Burst: r.part.Burst, Ended: true})
			}
		}
	}
	slices.Sort(b.IDs)
	slices.SortFunc(b.Parts, func(x, y ConsumerInfo) int {
		return cmp.Or(cmp.Compare(x.Stream, y.Stream), strings.Compare(x.ID, y.ID))
	})
	b.Parts = append(b.Parts, ConsumerInfo{ID: "rls", Rate: sh.rls.cur.Rate, Burst: sh.rls.cur.Burst, Demand: sh.rlsDemand})
	return b
}

// idString is id as key=value pairs, sorted by key.
func idString(id map[string]string) string {
	parts := make([]string, 0, len(id))
	for k, v := range id {
		parts = append(parts, k+"="+v)
	}
	slices.Sort(parts)
	return strings.Join(parts, ",")
}

// Collector returns the service's Prometheus series. They appear once a
// stream has been opened, so a daemon no Envoy speaks RLQS to shows none.
func (s *Service) Collector() prometheus.Collector { return collector{s} }

type collector struct{ s *Service }

var (
	descStreams  = prometheus.NewDesc("sharelimit_rlqs_streams", "Open RLQS streams.", nil, nil)
	descIDs      = prometheus.NewDesc("sharelimit_rlqs_bucket_ids", "Distinct RLQS bucket ids held (capped by --max-buckets).", nil, nil)
	descShares   = prometheus.NewDesc("sharelimit_rlqs_shares", "Bucket keys whose share RLQS divides.", nil, nil)
	descShare    = prometheus.NewDesc("sharelimit_rlqs_share_rate", "This replica's share (w·R, per second) of the bucket keys RLQS divides, summed by rule.", []string{"domain", "rule"}, nil)
	descAssigned = prometheus.NewDesc("sharelimit_rlqs_assigned_rate", "The parts given out (RLQS assignments, RLS's lease, ended streams' last assignments, per second), summed by rule; at most the share rate.", []string{"domain", "rule"}, nil)
	descReports  = prometheus.NewDesc("sharelimit_rlqs_reports_total", "RLQS usage reports received.", nil, nil)
	descPushes   = prometheus.NewDesc("sharelimit_rlqs_responses_total", "RLQS responses sent (answers to reports and pushed changes).", nil, nil)
	descRefusals = prometheus.NewDesc("sharelimit_rlqs_refusals_total", "RLQS streams ended or bucket ids denied, by reason.", []string{"reason"}, nil)
)

// Describe sends nothing: the series appear only once RLQS is used, so the
// collector is unchecked.
func (collector) Describe(chan<- *prometheus.Desc) {}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	if !s.everOpened.Load() {
		return
	}
	type rk struct{ domain, rule string }
	sums := map[rk][2]float64{}
	s.mu.Lock()
	streams, ids, shares := len(s.streams), len(s.ids), len(s.shares)
	for _, sh := range s.shares {
		k := rk{sh.key.domain, sh.target.Rule}
		v := sums[k]
		sums[k] = [2]float64{v[0] + sh.budget.Rate, v[1] + sh.assigned.Rate}
	}
	s.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	gauge(descStreams, float64(streams))
	gauge(descIDs, float64(ids))
	gauge(descShares, float64(shares))
	for k, v := range sums {
		gauge(descShare, v[0], k.domain, k.rule)
		gauge(descAssigned, v[1], k.domain, k.rule)
	}
	ch <- prometheus.MustNewConstMetric(descReports, prometheus.CounterValue, float64(s.reports.Load()))
	ch <- prometheus.MustNewConstMetric(descPushes, prometheus.CounterValue, float64(s.pushes.Load()))
	for i := range s.refusals {
		ch <- prometheus.MustNewConstMetric(descRefusals, prometheus.CounterValue, float64(s.refusals[i].Load()), reasonNames[i])
	}
}

// Used reports whether a stream has ever been opened: until then the pages
// and metrics show nothing of RLQS.
func (s *Service) Used() bool { return s.everOpened.Load() }
