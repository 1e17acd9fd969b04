package rlqs

// DefaultMaxIDBytes bounds the bucket ids held, by the bytes of their keys
// (the domain with the id's keys and values), whatever their number:
// --max-buckets ids of MaxIDBytes each would hold gigabytes. Each id is
// stored twice (its key and its map), so the heap they take is a little
// over twice this.
const DefaultMaxIDBytes = 64 << 20

// entry finds or creates (domain, id); nil when MaxBuckets ids, or
// MaxIDBytes of them, are held.
func (s *Service) entry(domain string, id map[string]string, now int64) *idEntry {
	k := idKey(domain, id)
	if e := s.ids[k]; e != nil {
		return e
	}
	size := len(k) // the domain and the id, as the table holds its key
	if len(s.ids) >= s.opt.MaxBuckets || s.idBytes+size > s.opt.MaxIDBytes {
		if !s.overflowed {
			s.overflowed = true
			s.log.Warn("rlqs: bucket ids past --max-buckets, or past their bytes' bound, are denied",
				"max_buckets", s.opt.MaxBuckets, "max_id_bytes", s.opt.MaxIDBytes, "domain", domain)
		}
		return nil
	}
	e := &idEntry{key: k, domain: domain, id: cloneID(id), consumers: map[*stream]*consumer{}, size: size}
	s.ids[k] = e
	s.idBytes += size
	s.bind(e, s.opt.Engine.Resolve(domain, e.id), now)
	return e
}

func cloneID(id map[string]string) map[string]string {
	c := make(map[string]string, len(id))
	for k, v := range id {
		c[k] = v
	}
	return c
}
