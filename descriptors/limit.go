package descriptors

import (
	"fmt"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

func isLimitKey(k string) bool {
	switch k {
	case "unit", "requests_per_unit", "unlimited", "name", "replaces",
		"unit_multiplier", "burst", "policy", "max_wait", "share":
		return true
	}
	return false
}

// limitDraft is a rate_limit block being read: the limit, the unit as written,
// and the nodes that the checks across fields point their errors at.
type limitDraft struct {
	*Limit
	unitText                                               string
	hasUnit                                                bool
	hasRPU                                                 bool
	unit, rpu, unlimited, mult, burst, policy, wait, share *yaml.Node
	replaceNodes                                           []*yaml.Node // by replaces index
}

// limit reads a rate_limit block. Each field is read by a step of its own, in
// the file's order; then the rules that span fields are checked. Any error
// gives nil.
func (p *parser) limit(n *yaml.Node, path string) *Limit {
	d := limitDraft{Limit: &Limit{}}
	before := len(p.errs)
	p.fields(n, path, isLimitKey, func(key string, k, v *yaml.Node) { p.limitField(&d, key, k, v, path+"."+key) })
	if n.Kind != yaml.MappingNode {
		return nil
	}
	unit := p.checkUnit(&d, n, path)
	p.checkRequests(&d, n, path)
	p.checkPolicy(&d, path)
	for i, name := range d.replaces {
		if name == d.name {
			p.errorf(d.replaceNodes[i], fmt.Sprintf("%s.replaces[%d]", path, i), "replaces should not contain name of same descriptor")
		}
	}
	if len(p.errs) > before {
		return nil
	}
	d.Limit.unit = unit
	d.Limit.finish()
	return d.Limit
}

func (p *parser) limitField(d *limitDraft, key string, k, v *yaml.Node, fp string) {
	switch key {
	case "unit":
		d.unit, d.hasUnit, d.unitText = v, true, p.str(v, fp)
	case "requests_per_unit":
		d.rpu = v
		if x, ok := p.uint(v, fp, 32); ok {
			d.requestsPerUnit, d.hasRPU = uint32(x), true
		}
	case "unlimited":
		d.unlimited, d.Limit.unlimited = k, p.boolean(v, fp)
	case "name":
		d.name = p.str(v, fp)
	case "replaces":
		d.replaces, d.replaceNodes = p.replaces(v, fp)
	case "unit_multiplier":
		p.unitMultiplier(d, v, fp)
	case "burst":
		p.burstField(d, v, fp)
	case "policy":
		p.policyField(d, v, fp)
	case "max_wait":
		p.maxWait(d, v, fp)
	case "share":
		p.shareField(d, v, fp)
	}
}

func (p *parser) unitMultiplier(d *limitDraft, v *yaml.Node, fp string) {
	x, ok := p.uint(v, fp, 32)
	if !ok {
		return
	}
	if x < 1 {
		p.errorf(v, fp, "must be at least 1")
	}
	d.unitMultiplier, d.mult = uint32(x), v
}

func (p *parser) burstField(d *limitDraft, v *yaml.Node, fp string) {
	d.burst = v
	x, ok := p.uint(v, fp, 63)
	if !ok {
		return
	}
	if x < 1 {
		p.errorf(v, fp, "must be at least 1 (use requests_per_unit: 0 to block)")
	}
	d.Limit.burst = x
}

func (p *parser) policyField(d *limitDraft, v *yaml.Node, fp string) {
	d.policy = v
	switch s := p.str(v, fp); strings.ToLower(s) {
	case "reject", "":
		d.Limit.policy = Reject
	case "wait":
		d.Limit.policy = Wait
	default:
		p.errorf(v, fp, "invalid policy '%s' (want reject or wait)", s)
	}
}

// shareField reads rate_limit.share, a sharelimit extension: cluster (the
// default), replica or demand.
func (p *parser) shareField(d *limitDraft, v *yaml.Node, fp string) {
	d.share = v
	switch s := p.str(v, fp); strings.ToLower(s) {
	case "cluster", "":
		d.Limit.share = ShareCluster
	case "replica":
		d.Limit.share = ShareReplica
	case "demand":
		d.Limit.share = ShareDemand
	default:
		p.errorf(v, fp, "invalid share '%s' (want cluster, replica or demand)", s)
	}
}

func (p *parser) maxWait(d *limitDraft, v *yaml.Node, fp string) {
	d.wait = v
	s := p.str(v, fp)
	w, err := time.ParseDuration(s)
	switch {
	case s == "":
	case err != nil:
		p.errorf(v, fp, "invalid duration '%s' (want e.g. 15ms)", s)
	case w <= 0:
		p.errorf(v, fp, "must be positive, got %s", s)
	default:
		d.Limit.maxWait = w
	}
}

// checkUnit: an unlimited limit takes no unit and no bucket settings; any
// other needs a valid unit, and a window of at most MaxWindow.
func (p *parser) checkUnit(d *limitDraft, n *yaml.Node, path string) Unit {
	unit, valid := ParseUnit(d.unitText)
	switch {
	case d.Limit.unlimited && d.hasUnit && valid:
		p.errorf(d.unit, path+".unit", "should not specify rate limit unit when unlimited")
	case d.Limit.unlimited:
		if x := firstOf(d.burst, d.policy, d.wait, d.share); x != nil {
			p.errorf(x, path, "burst, policy, max_wait and share have no meaning when unlimited")
		}
	case !valid:
		p.errorf(firstOf(d.unit, n), path+".unit", "invalid rate limit unit '%s'", d.unitText)
	case d.mult != nil && !WindowOK(unit, d.unitMultiplier):
		p.errorf(d.mult, path+".unit_multiplier", "a window of %d %ss is longer than the %d-year maximum",
			d.unitMultiplier, unit, MaxWindow/Year.Duration())
	}
	return unit
}

// checkRequests: requests_per_unit is required unless unlimited, and a
// blocking limit has no burst.
func (p *parser) checkRequests(d *limitDraft, n *yaml.Node, path string) {
	if !d.Limit.unlimited && !d.hasRPU && d.rpu == nil {
		p.errorf(firstOf(d.unlimited, n), path, "requests_per_unit is required (0 blocks every request; or set unlimited: true)")
	}
	if !d.Limit.unlimited && d.hasRPU && d.requestsPerUnit == 0 && d.burst != nil {
		p.errorf(d.burst, path+".burst", "a blocking limit (requests_per_unit: 0) takes no burst")
	}
}

// checkPolicy: wait and max_wait go together.
func (p *parser) checkPolicy(d *limitDraft, path string) {
	if d.Limit.policy == Wait && d.Limit.maxWait == 0 && d.wait == nil {
		p.errorf(d.policy, path+".policy", "policy wait needs max_wait (e.g. 15ms)")
	}
	if d.Limit.policy != Wait && d.wait != nil {
		p.errorf(d.wait, path+".max_wait", "max_wait needs policy: wait")
	}
}

func isNameKey(k string) bool { return k == "name" }

func (p *parser) replaces(v *yaml.Node, path string) ([]string, []*yaml.Node) {
	if v.Kind != yaml.SequenceNode {
		p.errorf(v, path, "want a list of {name: ...}, got %s", kindName(v))
		return nil, nil
	}
	var out []string
	var nodes []*yaml.Node
	for i, item := range v.Content {
		ip := fmt.Sprintf("%s[%d]", path, i)
		if item.Kind == yaml.AliasNode && item.Alias != nil {
			item = item.Alias
		}
		if item.Kind != yaml.MappingNode {
			p.errorf(item, ip, "yaml file contains list of type other than map: %s", strings.TrimSpace(describe(item)))
			continue
		}
		name, at := "", item
		p.fields(item, ip, isNameKey, func(_ string, _, v *yaml.Node) { name, at = p.str(v, ip+".name"), v })
		if name == "" {
			p.errorf(item, ip, "should not have an empty replaces entry")
			continue
		}
		out = append(out, name)
		nodes = append(nodes, at)
	}
	return out, nodes
}
