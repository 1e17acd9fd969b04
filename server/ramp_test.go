package server

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/descriptors/bucket"
)

// A join ramp in progress shows on /rlconfig (text and JSON, with each
// rule's ramp) and on the status page; none shows once it is over.
func TestJoinRampShown(t *testing.T) {
	f, _, srv := newAdmin(t)
	now := f.svc.clock()
	f.engine.Store().SetRamp(&bucket.Ramp{Start: now, Cap: 10 * time.Second})
	_, text := get(t, srv.URL+"/rlconfig")
	if !strings.Contains(text, "join ramp: new buckets start emptier than full") || !strings.Contains(text, "(join ramp: new buckets fill over 1 s)") {
		t.Fatalf("/rlconfig:\n%s", text)
	}
	_, js := get(t, srv.URL+"/rlconfig?format=json")
	var c RLConfig
	if err := json.Unmarshal([]byte(js), &c); err != nil || c.JoinRamp == nil || c.JoinRamp.EndsInSeconds <= 0 {
		t.Fatalf("json join_ramp: %+v %v", c.JoinRamp, err)
	}
	ramped := 0
	for _, r := range c.Rules {
		if r.RampSeconds > 0 {
			ramped++
		}
	}
	if ramped == 0 {
		t.Fatal("no rule shows its ramp")
	}
	if _, page := get(t, srv.URL+"/"); !strings.Contains(page, `id="join-ramp"`) {
		t.Fatal("the status page shows no ramp")
	}
	f.engine.Store().SetRamp(&bucket.Ramp{Start: now - int64(time.Hour), Cap: 10 * time.Second})
	if _, text = get(t, srv.URL+"/rlconfig"); strings.Contains(text, "join ramp") {
		t.Fatalf("a ramp that is over still shows:\n%s", text)
	}
}
