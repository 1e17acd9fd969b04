package daemon

import (
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/sharelimit/sharelimit/config"
	"github.com/sharelimit/sharelimit/demand/controller"
	"github.com/sharelimit/sharelimit/descriptors/engine"
	"github.com/sharelimit/sharelimit/internal/human"
	"github.com/sharelimit/sharelimit/membership"
	"github.com/sharelimit/sharelimit/state"
)

// Membership's wiring: the views, their sources and dampers, and the demand
// controller of each Consul service.

// membership sets up one view per membership source: the default view, from
// --consul-service or else the static --replicas count, and one per service
// --domain-service names, each dividing its own domains' limits in an engine
// group of its own. A Consul view starts at the --replicas count and stands
// until Consul first answers; with --membership-hold, its changes pass
// through a damper, so that one that grows the share waits until it holds.
func (d *Daemon) membership(reg prometheus.Registerer) error {
	cfg := d.cfg
	client, token, err := d.consulClient()
	if err != nil {
		return err
	}
	if cfg.PeersDNS != "" && cfg.Replicas == 1 && d.savedView(dnsKey(cfg.PeersDNS)) == nil {
		// As with Consul: until the name first resolves, --replicas
		// stands, unless the state file saved a view.
		d.log.Warn("membership: --replicas is 1, so until --peers-dns first resolves this replica enforces every limit whole; set --replicas to the replica count you expect",
			"name", cfg.PeersDNS)
	}
	d.addViews()
	var series controller.Series
	for _, v := range d.views {
		if err := d.watch(v, client, token); err != nil {
			return err
		}
		v.register(reg)
		if v.consul != nil {
			v.demand = controller.New(reshared{controller.NewEngine(d.engine), d}, client, controller.Config{
				Service: v.service, Group: v.group, Prefix: cfg.DemandPrefix, Interval: cfg.DemandInterval,
				MaxWrites: cfg.DemandMaxWrites, QueryRate: cfg.ConsulQueryRate, Node: cfg.Node, TopKeys: cfg.DemandTopKeys,
				View: func() membership.View { return *v.cur.Load() }, Passing: v.consul.PassingNodes, Hold: departedHold(cfg), Clock: d.clock,
				Logger: d.log.With("component", "demand"),
			})
			v.demand.Register(reg)
			series = append(series, v.demand)
		}
	}
	reg.MustRegister(series)
	return nil
}

// engineOptions are the engine's options under cfg, with the key seed of
// snap when it is not nil. A service --domain-service names, other than
// --consul-service, divides its domains' limits in a weight group of its
// own, in the order of cfg.Services, which addViews follows.
func engineOptions(cfg *config.Config, snap *state.Snapshot) engine.Options {
	opts := engine.Options{Weight: 1 / float64(cfg.Replicas), QuotaMode: cfg.QuotaMode,
		DemandAll: cfg.ShareMode == config.ShareDemand, TopKeys: cfg.DemandTopKeys}
	if cfg.DemandTopKeys == 0 {
		opts.TopKeys = -1 // per-value rules keep their equal shares
	}
	if snap != nil {
		opts.Seed = snap.Seed
	}
	byService := domainsByService(cfg)
	for _, service := range cfg.Services() {
		if service != cfg.ConsulService {
			opts.Groups = append(opts.Groups, engine.Group{Domains: byService[service], Weight: 1 / float64(cfg.Replicas)})
		}
	}
	return opts
}

// domainsByService are the domains --domain-service gives each service.
func domainsByService(cfg *config.Config) map[string][]string {
	byService := map[string][]string{}
	for _, m := range cfg.DomainServices {
		byService[m.Service] = append(byService[m.Service], m.Domain)
	}
	return byService
}

// consulClient is the Consul client and its token when a view is watched
// in Consul; nil otherwise.
func (d *Daemon) consulClient() (*api.Client, string, error) {
	cfg := d.cfg
	if cfg.ConsulService == "" && len(cfg.DomainServices) == 0 {
		return nil, "", nil
	}
	ccfg := api.DefaultConfig() // CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN, CONSUL_CACERT... as the consul CLI
	client, err := api.NewClient(ccfg)
	if err != nil {
		return nil, "", fmt.Errorf("consul client: %w", err)
	}
	if cfg.Replicas == 1 && d.snap == nil {
		// Until Consul first answers, --replicas stands: at 1, a replica
		// whose watch never succeeds (a wrong token, an ACL-filtered
		// answer, an agent it cannot reach) enforces every limit whole.
		d.log.Warn("membership: --replicas is 1, so until Consul first answers this replica enforces every limit whole; set --replicas to the replica count you expect",
			"service", cfg.ConsulService)
	}
	return client, ccfg.Token, nil
}

// addViews makes the default view and one per --domain-service service.
// The default view takes --consul-service's mapped domains too, if any are
// mapped to it: they are divided by the same count.
func (d *Daemon) addViews() {
	cfg := d.cfg
	byService := domainsByService(cfg)
	def := &view{service: cfg.ConsulService, group: engine.DefaultGroup, engine: d.engine, clock: d.clock}
	d.views = views{def}
	for _, service := range cfg.Services() {
		if service == cfg.ConsulService {
			continue
		}
		// The engine numbers the groups of engineOptions in this order.
		d.views = append(d.views, &view{service: service, domains: byService[service], engine: d.engine, clock: d.clock,
			group: engine.DefaultGroup + len(d.views)})
	}
}

// watch gives view v its source (Consul, DNS, or none for a static count)
// and its damper, and publishes its first view.
func (d *Daemon) watch(v *view, client *api.Client, token string) error {
	cfg := d.cfg
	first := membership.NewStatic(cfg.Replicas).View()
	if v.service != "" {
		c, err := membership.NewConsul(membership.ConsulConfig{
			Service: v.service, Filter: cfg.ConsulFilter, Datacenter: cfg.ConsulDatacenter,
			Node: cfg.Node, Stale: cfg.ConsulStale, Replicas: cfg.Replicas, Initial: d.savedView(v.service),
			QueryRate: cfg.ConsulQueryRate, WaitTime: cfg.ConsulWait, Token: token,
			IgnoreWeights: !cfg.ConsulWeights, NoCache: !cfg.ConsulCache, Grace: grace(cfg.MembershipGrace),
			Logger: d.log.With("component", "membership"), OnUpdate: v.observe, // it names the service itself
		}, client)
		if err != nil {
			return fmt.Errorf("consul membership of service %s: %w", v.service, err)
		}
		v.consul, first = c, c.View()
	} else if cfg.PeersDNS != "" {
		// --peers-dns excludes --consul-service and --domain-service:
		// this is the default view, and the only one.
		s, err := membership.NewDNS(membership.DNSConfig{
			Name: cfg.PeersDNS, Server: cfg.PeersDNSServer, Interval: cfg.PeersDNSInterval, Replicas: cfg.Replicas,
			Initial: d.savedView(dnsKey(cfg.PeersDNS)), Grace: grace(cfg.MembershipGrace), UpstreamBy: cfg.UpstreamBy,
			Logger: d.log.With("component", "membership"), OnUpdate: v.observe, // it names the name itself
		})
		if err != nil {
			return fmt.Errorf("dns membership of %s: %w", cfg.PeersDNS, err)
		}
		v.dns, v.name, first = s, cfg.PeersDNS, s.View()
	}
	// A DNS view's peers see a change up to one --peers-dns-interval
	// (and a lookup's timeout) after this replica: its grows wait
	// that too, even with --membership-hold 0.
	var lag time.Duration
	if v.dns != nil {
		lag = v.dns.PeersLag()
	}
	if hold := membershipHold(cfg); v.watched() && (hold > 0 || lag > 0) {
		var err error
		if v.damper, err = membership.NewDamper(first, membership.DamperConfig{
			Hold: hold, PeersLag: lag, OnUpdate: v.publish,
			Logger: d.log.With("component", "membership", v.labelKey(), v.label()),
		}); err != nil {
			return fmt.Errorf("%s membership of %s: %w", first.Source, v.label(), err)
		}
	}
	if first.Source == "static" && unshared(cfg) {
		first.Fault = membership.FaultUnshared
		d.log.Warn("membership: every replica enforces every limit whole: this is upstream's deployment ("+human.Names(cfg.UpstreamBy)+
			"), whose replicas shared one count in Redis, and membership is static at --replicas 1, so N replicas admit up to N times each limit; "+
			"set "+config.EnvName("peers-dns")+" to a name that resolves to every replica (a Kubernetes headless Service, a compose service), "+
			"or "+config.EnvName("replicas")+" to the replica count", "fault", membership.FaultUnshared)
	}
	v.publish(first)
	return nil
}

// unshared reports whether cfg is upstream's deployment at --replicas 1; with
// a static view, that is a fault: upstream's replicas shared their counts,
// and these do not.
func unshared(cfg *config.Config) bool {
	return len(cfg.UpstreamBy) > 0 && cfg.Replicas == 1
}

// membershipHold is how long a view that grows this replica's share must
// stand: --membership-hold, or with --rlqs at least --rlqs-ttl. A replica
// that dies leaves its Envoys enforcing their last RLQS assignments until
// those expire; the others' shares may grow into its part only after that.
func membershipHold(cfg *config.Config) time.Duration {
	if cfg.RLQS {
		return max(cfg.MembershipHold, cfg.RLQSTTL)
	}
	return cfg.MembershipHold
}

// departedHold is how long the demand leader keeps the division in force
// after a replica leaves: with --rlqs, the replica's Envoys may enforce its
// share until their assignments expire, --rlqs-ttl after it last answered.
func departedHold(cfg *config.Config) time.Duration {
	if cfg.RLQS {
		return cfg.RLQSTTL
	}
	return 0
}
