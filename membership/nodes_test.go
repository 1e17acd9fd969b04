package membership

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/sharelimit/sharelimit/internal/consultest"
	"github.com/sharelimit/sharelimit/internal/testutil"
)

// TestAgentPassingNodes: the watch knows which nodes have a passing instance
// (the demand leader counts only their reports): a failing check or a
// deregistration takes a node out, and a node with two instances is listed
// once.
func TestAgentPassingNodes(t *testing.T) {
	t.Parallel()
	a := consultest.Start(t)
	registerWeighted(t, a, "node-a", "web-a", 1, true)
	registerWeighted(t, a, "node-a", "web-a2", 1, true)
	registerWeighted(t, a, "node-b", "web-b", 1, true)
	registerWeighted(t, a, "node-c", "web-c", 1, false)
	c := watch(t, ConsulConfig{Service: "web", Node: "node-a"}, newClient(t, a.Addr(), ""))
	await := func(want ...string) {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, func() error {
			if got := c.PassingNodes(); !slices.Equal(got, want) {
				return fmt.Errorf("passing nodes %v, want %v", got, want)
			}
			return nil
		})
	}
	await("node-a", "node-b")
	registerWeighted(t, a, "node-c", "web-c", 1, true)
	await("node-a", "node-b", "node-c")
	registerWeighted(t, a, "node-b", "web-b", 1, false)
	await("node-a", "node-c")
}
