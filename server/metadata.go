package server

import (
	"strconv"
	"strings"

	commonv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/sharelimit/sharelimit/descriptors"

	"github.com/sharelimit/sharelimit/descriptors/engine"
)

// Response dynamic metadata, as upstream's RESPONSE_DYNAMIC_METADATA sends it
// for Envoy to log or route on:
//
//	domain:      the request's domain
//	descriptors: per request descriptor, entries ["key=value", ...], and its
//	             limit override and hits_addend when it has them
//	hitsAddend:  the request's hits_addend, when not 0
//	metadata:    the YAML metadata of every descriptor that passed (not over
//	             its limit, not unlimited), merged: the first descriptor's value
//	             wins, and maps present in several are merged key by key
//
// Two things differ on purpose. An override's limit is written as
// "requests_per_unit:N unit:UNIT" (upstream writes Go's protobuf text, whose
// spacing is randomised). And the metadata of a detailed_metric or
// value_to_metric rule is sent too (upstream loses it when it rebuilds such a
// rule's stats).

// dynamicMetadata builds the struct for one decided request.
func dynamicMetadata(req *rlsv3.RateLimitRequest, sts []engine.Status, p *setParts) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.GetDomain())}
	descs := make([]*structpb.Value, 0, len(req.GetDescriptors()))
	for _, d := range req.GetDescriptors() {
		if d == nil {
			continue
		}
		descs = append(descs, structpb.NewStructValue(descriptorStruct(d)))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: descs})
	if h := req.GetHitsAddend(); h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	passed := &structpb.Struct{Fields: map[string]*structpb.Value{}}
	for i := range sts {
		st := &sts[i]
		if st.Code == engine.OverLimit || st.Rule == nil || st.Limit == nil || st.Limit.Unlimited() {
			continue
		}
		if md := p.metadata(st); md != nil {
			mergeStruct(passed, md)
		}
	}
	if len(passed.Fields) > 0 {
		fields["metadata"] = structpb.NewStructValue(passed)
	}
	return &structpb.Struct{Fields: fields}
}

func descriptorStruct(d *commonv3.RateLimitDescriptor) *structpb.Struct {
	entries := make([]*structpb.Value, len(d.GetEntries()))
	for i, e := range d.GetEntries() {
		entries[i] = structpb.NewStringValue(e.GetKey() + "=" + e.GetValue())
	}
	f := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
	if l := d.GetLimit(); l != nil {
		f["limit"] = structpb.NewStringValue(overrideText(l))
	}
	if h := d.GetHitsAddend(); h != nil {
		f["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
	}
	return &structpb.Struct{Fields: f}
}

// overrideText writes an override as protobuf text, in one stable spacing.
func overrideText(l *commonv3.RateLimitDescriptor_RateLimitOverride) string {
	var b strings.Builder
	b.WriteString("requests_per_unit:")
	b.WriteString(strconv.FormatUint(uint64(l.GetRequestsPerUnit()), 10))
	b.WriteString(" unit:")
	b.WriteString(l.GetUnit().String())
	return b.String()
}

// mergeStruct adds src's fields to dst: a key dst lacks is copied (deeply, so
// no later merge can change src, which is a rule's own); where both hold a
// map, the maps are merged the same way; otherwise dst's value stays.
func mergeStruct(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = proto.Clone(v).(*structpb.Value)
			continue
		}
		if hs, vs := have.GetStructValue(), v.GetStructValue(); hs != nil && vs != nil {
			mergeStruct(hs, vs)
		}
	}
}

// ruleMetadata is a rule's metadata as a Struct; nil when it has none. The
// parser keeps metadata in JSON's types, so the conversion cannot fail; should
// it, the rule sends none rather than failing the request.
func ruleMetadata(r *descriptors.Rule) *structpb.Struct {
	md := r.Metadata()
	if len(md) == 0 {
		return nil
	}
	s, err := structpb.NewStruct(md)
	if err != nil {
		return nil
	}
	return s
}
