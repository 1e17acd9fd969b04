package descriptors

import (
	"bytes"
	"maps"
	"slices"
	"strings"
	"testing"
)

func bucketSet(t testing.TB) *Set {
	t.Helper()
	s, err := compileFiles(t, "testdata/bucketid/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// id builds a bucket id from "key=value" strings.
func id(kvs ...string) map[string]string {
	m := make(map[string]string, len(kvs))
	for _, kv := range kvs {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func TestMatchBucket(t *testing.T) {
	d := bucketSet(t).Domain("rlqs")
	cases := []struct {
		name string
		id   map[string]string
		// want is the matched rule's requests_per_unit, -1 for a rule with
		// no limit, -2 for an unlimited one, 0 for no match; entries is
		// the id in the rule's path order.
		want    int
		entries []string
	}{
		{"exact wins", id("path=/login"), 1, []string{"path=/login"}},
		{"first wildcard in file order", id("path=/api/x"), 2, []string{"path=/api/x"}},
		{"later wildcard", id("path=/about"), 3, []string{"path=/about"}},
		{"key-only", id("path=/other"), 4, []string{"path=/other"}},
		{"empty value is key-only", id("path="), 4, []string{"path="}},
		{"order tie: the path written first wins", id("user=alice", "plan=free"), 5, []string{"user=alice", "plan=free"}},
		{"only the second order matches", id("user=bob", "plan=free"), 6, []string{"plan=free", "user=bob"}},
		{"only the first order matches", id("user=alice", "plan=gold"), 5, []string{"user=alice", "plan=gold"}},
		{"neither order matches", id("user=bob", "plan=gold"), 0, nil},
		{"nested with a wildcard", id("ip=10.0.0.1", "tenant=t1", "route=/v2/x"), 7, []string{"tenant=t1", "route=/v2/x", "ip=10.0.0.1"}},
		{"nested, key-only at depth 2", id("tenant=t1", "route=/other"), 8, []string{"tenant=t1", "route=/other"}},
		{"nested, wildcard level without a limit", id("tenant=t1", "route=/v2"), -1, []string{"tenant=t1", "route=/v2"}},
		{"nested, wildcard missed at depth 2 goes key-only, then too deep", id("ip=1", "tenant=t1", "route=/x"), 0, nil},
		{"a parent's key set alone", id("nolimit=x"), -1, []string{"nolimit=x"}},
		{"unlimited", id("free=anything"), -2, []string{"free=anything"}},
		{"no backtracking", id("trap=exact", "deeper=nope"), 0, nil},
		{"key-only path", id("trap=t", "deeper=nope"), 11, []string{"trap=t", "deeper=nope"}},
		{"a key twice on a path: a map names only the first level", id("dup=a"), -1, []string{"dup=a"}},
		{"a key set matching two paths: lower ID wins", id("zone=z1", "region=r9"), 13, []string{"zone=z1", "region=r9"}},
		{"a key set matching two paths: the other when the first misses", id("zone=z1", "region=r1"), 14, []string{"region=r1", "zone=z1"}},
		{"a key no rule has", id("nokey=1"), 0, nil},
		{"a parent's path is a path of its own", id("tenant=t1"), -1, []string{"tenant=t1"}},
		{"a subset of a path's keys is not the path", id("route=/v1", "ip=1"), 0, nil},
		{"a superset is not the path", id("path=/login", "extra=1"), 0, nil},
		{"empty id", map[string]string{}, 0, nil},
		{"nil id", nil, 0, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, entries := d.MatchBucket(tc.id)
			got := 0
			switch {
			case r == nil:
			case r.Limit() == nil:
				got = -1
			case r.Limit().Unlimited():
				got = -2
			default:
				got = int(r.Limit().RequestsPerUnit())
			}
			if got != tc.want {
				t.Fatalf("matched %d (%v), want %d", got, r, tc.want)
			}
			var kv []string
			for _, e := range entries {
				kv = append(kv, e.GetKey()+"="+e.GetValue())
			}
			if !slices.Equal(kv, tc.entries) {
				t.Fatalf("entries %q, want %q", kv, tc.entries)
			}
			// The id, in the winner's order, is what RLS matches too.
			if r != nil && r.Limit() != nil && d.Match(entries) != r {
				t.Fatalf("Match(%q) = %v, not the bucket's rule %v", kv, d.Match(entries), r)
			}
		})
	}
}

// TestMatchBucketIsTheFirstOfAllOrders checks MatchBucket against the
// definition, by brute force: walk every order of the id's keys with Match's
// walk, and take the reached rule with the lowest ID.
func TestMatchBucketIsTheFirstOfAllOrders(t *testing.T) {
	set := bucketSet(t)
	d := set.Domain("rlqs")
	values := map[string][]string{
		"path": {"/login", "/api/x", "/ab", "z", ""}, "user": {"alice", "bob"}, "plan": {"free", "gold"},
		"tenant": {"t1", "t2"}, "route": {"/v1", "/x"}, "ip": {"1"}, "zone": {"z1", "z2"}, "region": {"r9", "r1"},
		"trap": {"exact", "t"}, "deeper": {"other", "nope"},
	}
	keys := slices.Sorted(maps.Keys(values))
	var ids []map[string]string
	var grow func(i int, cur map[string]string)
	grow = func(i int, cur map[string]string) {
		if len(cur) > 3 {
			return
		}
		if i == len(keys) {
			if len(cur) > 0 {
				ids = append(ids, maps.Clone(cur))
			}
			return
		}
		grow(i+1, cur)
		for _, v := range values[keys[i]] {
			cur[keys[i]] = v
			grow(i+1, cur)
			delete(cur, keys[i])
		}
	}
	grow(0, map[string]string{})
	for _, m := range ids {
		got, _ := d.MatchBucket(m)
		want := bruteBucket(set, m)
		if got != want {
			t.Fatalf("id %v: MatchBucket %v, by brute force %v", m, got, want)
		}
	}
}

func bruteBucket(set *Set, m map[string]string) *Rule {
	var best *Rule
	keys := slices.Collect(maps.Keys(m))
	var perm func(k int)
	perm = func(k int) {
		if k == len(keys) {
			var en []string
			for _, key := range keys {
				en = append(en, key+"="+m[key])
			}
			_, steps := set.trace("rlqs", entries(en...))
			if len(steps) == len(keys) {
				last := steps[len(steps)-1].Rule
				if last != nil && last.depth == len(keys) && (best == nil || last.id < best.id) {
					best = last
				}
			}
			return
		}
		for i := k; i < len(keys); i++ {
			keys[k], keys[i] = keys[i], keys[k]
			perm(k + 1)
			keys[k], keys[i] = keys[i], keys[k]
		}
	}
	perm(0)
	return best
}

func TestExplainBucket(t *testing.T) {
	set := bucketSet(t)
	cases := []struct {
		name, domain string
		id           map[string]string
		want         string
	}{
		{"limit", "rlqs", id("plan=free", "user=bob"), "RLQS: a token bucket"},
		{"no rule", "rlqs", id("user=bob"), "result: DENY_ALL"},
		{"no limit", "rlqs", id("nolimit=x"), "RLQS: DENY_ALL: the rule has no rate_limit"},
		{"unlimited", "rlqs", id("free=1"), "RLQS: ALLOW_ALL"},
		{"shadow mode", "rlqs", id("shadow=x"), "RLQS: ALLOW_ALL: the rule is in shadow_mode"},
		{"unknown domain", "nope", id("a=b"), "RLQS answers DENY_ALL"},
	}
	for _, tc := range cases {
		var b bytes.Buffer
		ExplainBucket(&b, set, tc.domain, tc.id, 0.5)
		if !strings.Contains(b.String(), tc.want) {
			t.Errorf("%s: no %q in\n%s", tc.name, tc.want, b.String())
		}
	}
}

// FuzzMatchBucket feeds arbitrary ids to MatchBucket over the test rules:
// it never panics, its entries are the id exactly, in the order of the
// rule's path, and a rule with a limit is what RLS matches for them.
func FuzzMatchBucket(f *testing.F) {
	f.Add("path", "/api/x", "", "", "", "")
	f.Add("user", "bob", "plan", "free", "", "")
	f.Add("tenant", "t1", "route", "/v2", "ip", "1")
	f.Add("zone", "z1", "region", "r1", "zone", "z1")
	set := bucketSet(f)
	if set.Len() == 0 {
		f.Fatal("no rules")
	}
	d := set.Domain("rlqs")
	f.Fuzz(func(t *testing.T, k1, v1, k2, v2, k3, v3 string) {
		m := map[string]string{}
		for _, kv := range [][2]string{{k1, v1}, {k2, v2}, {k3, v3}} {
			if kv[0] != "" {
				m[kv[0]] = kv[1]
			}
		}
		r, en := d.MatchBucket(m)
		if r == nil {
			if en != nil {
				t.Fatalf("no rule but entries %v", en)
			}
			return
		}
		if len(en) != len(m) || r.Depth() != len(m) {
			t.Fatalf("id %v: %d entries, rule depth %d", m, len(en), r.Depth())
		}
		for i, e := range en {
			if m[e.Key] != e.Value {
				t.Fatalf("entry %d %v is not the id's", i, e)
			}
		}
		if r.Limit() != nil && d.Match(en) != r {
			t.Fatalf("id %v: RLS matches %v, not %v", m, d.Match(en), r)
		}
		if want := bruteBucket(set, m); want != r {
			t.Fatalf("id %v: %v, by brute force %v", m, r, want)
		}
	})
}
