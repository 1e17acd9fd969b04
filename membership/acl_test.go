package membership

import (
	"strings"
	"testing"

	"github.com/hashicorp/consul/api"

	"github.com/sharelimit/sharelimit/internal/consultest"
)

// TestAgentACLFilteredAnswerIsAFault runs a real agent with ACLs on (default
// deny). A node-identity token reads the service but only its own node: the
// health answer lists only that node's instance, and Consul says so in
// X-Consul-Results-Filtered-By-Acls. Taken as a view, each replica would see
// "1 of 1" and enforce the whole limit. It is a fault: the last view (here
// --replicas) stands, and the fault is named. The same goes for no token at
// all, whose answer is filtered to nothing.
func TestAgentACLFilteredAnswerIsAFault(t *testing.T) {
	t.Parallel()
	// The agent's default token is the management token, so that the test's
	// own registrations (which send none) pass; the watchers send theirs.
	a := consultest.Start(t, consultest.WithArgs("-hcl",
		`acl { enabled = true, default_policy = "deny", tokens { initial_management = "root", default = "root" } }`))
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		a.RegisterInstance(n, "web-"+n, "web", true)
	}
	root := newClient(t, a.Addr(), "root")
	pol, _, err := root.ACL().PolicyCreate(&api.ACLPolicy{Name: "node-a-web",
		Rules: `service "web" { policy = "read" }
node "node-a" { policy = "read" }`}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tok, _, err := root.ACL().TokenCreate(&api.ACLToken{Policies: []*api.ACLTokenPolicyLink{{ID: pol.ID}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// Consul's anonymous token, which a request without a token gets.
	if _, _, err := root.ACL().TokenUpdate(&api.ACLToken{AccessorID: "00000000-0000-0000-0000-000000000002", Policies: nil}, nil); err != nil {
		t.Logf("anonymous token left as it is: %v", err)
	}
	for _, k := range []struct {
		name, token string
	}{
		{"node-identity token", tok.SecretID},
		{"a token that reads nothing", "00000000-0000-0000-0000-00000000dead"},
	} {
		t.Run(k.name, func(t *testing.T) {
			var logs logBuffer
			c := watch(t, fast(ConsulConfig{Node: "node-a", Replicas: 3, Token: k.token, Logger: logs.logger(), Grace: 0}), newClient(t, a.Addr(), k.token))
			v := waitView(t, c, func(v View) bool { return v.Errors >= 2 }, "the filtered answers reported")
			if v.Fault != FaultACLFiltered && !(k.token != tok.SecretID && v.Fault == FaultForbidden) {
				t.Errorf("fault %q, want %q; view %+v", v.Fault, FaultACLFiltered, v)
			}
			if v.Total != 3 || v.Weight != 1.0/3 || !v.ObservedAt.IsZero() {
				t.Errorf("view %+v: want the --replicas view (1/3) to stand, never a filtered count", v)
			}
			if !strings.Contains(logs.String(), "level=WARN") {
				t.Errorf("no WARN logged:\n%s", logs.String())
			}
		})
	}
}
