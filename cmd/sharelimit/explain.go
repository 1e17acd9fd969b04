package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"

	"github.com/sharelimit/sharelimit/descriptors"
	"github.com/sharelimit/sharelimit/internal/human"
	"github.com/sharelimit/sharelimit/server"
	"github.com/sharelimit/sharelimit/source"
)

// explain prints how one descriptor would be matched and limited, level by level.
func explain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("explain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("config-dir", "", "descriptor directory (or file)")
	domain := fs.String("domain", "", "the request's domain")
	replicas := fs.Int("replicas", 1, "replica count: the share is 1/N")
	weight := fs.Float64("weight", 0, "this replica's weight, instead of --replicas")
	bucket := fs.Bool("bucket", false, "the key=value arguments are one RLQS bucket id (a map: their order does not matter), not a descriptor")
	admin := fs.String("admin", "", "a running daemon's admin URL (http://127.0.0.1:8080): use the weight of the domain's membership view in force there, instead of --replicas")
	fs.Usage = func() { explainFlags(fs) }
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dir == "" || *domain == "" || fs.NArg() == 0 || *replicas < 1 || *weight < 0 || *weight > 1 || (*admin != "" && *weight > 0) {
		fmt.Fprintln(stderr, "usage: sharelimit explain --config-dir DIR --domain D [--replicas N | --weight W | --admin URL] key=value... [+ key=value...]\n       sharelimit explain --config-dir DIR --domain D [--replicas N | --weight W | --admin URL] --bucket key=value...")
		return 2
	}
	w := 1 / float64(*replicas)
	if *weight > 0 {
		w = *weight
	}
	if *admin != "" {
		v, ramp, err := liveView(*admin, *domain)
		if err != nil {
			fmt.Fprintf(stderr, "sharelimit explain: %v\n", err)
			return 1
		}
		w = v.Weight
		fmt.Fprintln(stdout, describeView(v))
		if ramp != nil {
			fmt.Fprintf(stdout, "join ramp in progress (%s in, over in %s): a key this daemon has no bucket for yet starts emptier than full, at the time since the ramp began over its rule's ramp (/rlconfig lists each rule's)\n",
				secs(ramp.ElapsedSeconds), secs(ramp.EndsInSeconds))
		}
	}
	if *bucket {
		return explainBucket(*dir, *domain, fs.Args(), w, stdout, stderr)
	}
	// A lone "+" separates the descriptors of one request.
	descs := [][]*commonv3.RateLimitDescriptor_Entry{nil}
	for _, kv := range fs.Args() {
		if kv == "+" {
			descs = append(descs, nil)
			continue
		}
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			fmt.Fprintf(stderr, "sharelimit explain: %q: want key=value (value may be empty)\n", kv)
			return 2
		}
		descs[len(descs)-1] = append(descs[len(descs)-1], &commonv3.RateLimitDescriptor_Entry{Key: k, Value: v})
	}
	for _, d := range descs {
		if len(d) == 0 {
			fmt.Fprintln(stderr, "sharelimit explain: an empty descriptor (check the + separators)")
			return 2
		}
	}
	set, err := source.Load(*dir)
	if err != nil {
		printErrors(stderr, err)
		return 1
	}
	descriptors.Explain(stdout, set, *domain, descs, w)
	return 0
}

// explainFlags prints explain's flags as the flag package does, but for
// --bucket: the list stays as scripts that read `explain -h` know it, and
// the usage line and README document --bucket.
func explainFlags(fs *flag.FlagSet) {
	fmt.Fprintln(fs.Output(), "Usage of explain:")
	shown := flag.NewFlagSet("explain", flag.ContinueOnError)
	shown.SetOutput(fs.Output())
	fs.VisitAll(func(f *flag.Flag) {
		if f.Name != "bucket" {
			shown.Var(f.Value, f.Name, f.Usage)
			shown.Lookup(f.Name).DefValue = f.DefValue
		}
	})
	shown.PrintDefaults()
}

// explainBucket prints which rule an RLQS bucket id, given as key=value
// arguments, selects and what RLQS assigns for it.
func explainBucket(dir, domain string, args []string, w float64, stdout, stderr io.Writer) int {
	id := make(map[string]string, len(args))
	for _, kv := range args {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			fmt.Fprintf(stderr, "sharelimit explain: %q: want key=value (value may be empty); a bucket id is one map, with no + separators\n", kv)
			return 2
		}
		if _, dup := id[k]; dup {
			fmt.Fprintf(stderr, "sharelimit explain: key %q twice: a bucket id is a map, each key once\n", k)
			return 2
		}
		id[k] = v
	}
	set, err := source.Load(dir)
	if err != nil {
		printErrors(stderr, err)
		return 1
	}
	descriptors.ExplainBucket(stdout, set, domain, id, w)
	return 0
}

// liveView asks a running daemon's /rlconfig for the membership view that
// divides domain's limits: the service --domain-service maps it to, else the
// default view.
func liveView(admin, domain string) (server.View, *server.JoinRamp, error) {
	client := &http.Client{Timeout: 5 * time.Second}
	resp, err := client.Get(strings.TrimSuffix(admin, "/") + "/rlconfig?format=json")
	if err != nil {
		return server.View{}, nil, fmt.Errorf("read the daemon's views: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return server.View{}, nil, fmt.Errorf("read the daemon's views: %s", resp.Status)
	}
	var c server.RLConfig
	if err := json.NewDecoder(io.LimitReader(resp.Body, 64<<20)).Decode(&c); err != nil {
		return server.View{}, nil, fmt.Errorf("read the daemon's views: %w", err)
	}
	v := c.Membership
	for _, s := range c.Services {
		if slices.Contains(s.Domains, domain) {
			v = s
		}
	}
	if !(v.Weight > 0) || v.Weight > 1 {
		return server.View{}, nil, fmt.Errorf("read the daemon's views: weight %v is not a share", v.Weight)
	}
	return v, c.JoinRamp, nil
}

// describeView says, in one line, which view divides the domain's limits.
func describeView(v server.View) string {
	var b strings.Builder
	switch {
	case v.Service == "" && v.Source == "static":
		fmt.Fprintf(&b, "membership: static (--replicas %d)", v.Total)
	case v.Service == "":
		fmt.Fprintf(&b, "membership: %s, %d replicas", v.Source, v.Total)
	default:
		fmt.Fprintf(&b, "membership: Consul service %s (%s), %d replicas, %d on this node", v.Service, v.Source, v.Total, v.Local)
		if v.TotalWeight != v.Total || v.LocalWeight != v.Local {
			fmt.Fprintf(&b, ", weights %d of %d", v.LocalWeight, v.TotalWeight)
		}
	}
	fmt.Fprintf(&b, ": weight %.4g (%s) in force", v.Weight, human.Share(v.Weight))
	if v.Source != "static" {
		fmt.Fprintf(&b, ", confirmed %s", human.AgoSeconds(v.AgeSeconds, v.ObservedAt.IsZero()))
	}
	if p := v.Pending; p != nil {
		fmt.Fprintf(&b, "; held: weight %.4g takes effect in %s if it holds", p.Weight, secs(p.InSecs))
	}
	if d := v.Demand; d != nil {
		for _, r := range d.Rules {
			fmt.Fprintf(&b, "\ndemand-shared %s: share %.4g in force here (equal %.4g), offered here %s, cluster admitted %.1f%% of the limit",
				r.Rule, r.Share, r.Equal, human.Rate(r.Offered, "second"), 100*r.ClusterAdmittedRatio)
		}
	}
	return b.String()
}

// secs formats a span given in seconds as a person reads it: "0.4 s", "9 s".
func secs(s float64) string { return human.Duration(time.Duration(s * float64(time.Second))) }
