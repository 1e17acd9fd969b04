package consultest

import (
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"go.uber.org/goleak"

	"github.com/sharelimit/sharelimit/internal/testutil"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// passing lists "node/serviceID" of the passing instances of service.
func passing(t *testing.T, a *Agent, service string) []string {
	t.Helper()
	entries, _, err := a.Client().Health().Service(service, "", true, nil)
	if err != nil {
		t.Fatalf("health of %s: %v", service, err)
	}
	var got []string
	for _, e := range entries {
		got = append(got, e.Node.Node+"/"+e.Service.ID)
	}
	slices.Sort(got)
	return got
}

func TestAgentLifecycle(t *testing.T) {
	t.Parallel()
	a := Start(t)
	if a.NodeName() == "" || a.Addr() == "" {
		t.Fatalf("agent has node %q, addr %q", a.NodeName(), a.Addr())
	}
	self, err := a.Client().Agent().NodeName()
	if err != nil || self != a.NodeName() {
		t.Fatalf("agent/self node = %q, %v; want %q", self, err, a.NodeName())
	}

	own := a.NodeName()
	a.RegisterInstance("ext-1", "web-1", "web", true)
	a.RegisterInstance("ext-2", "web-2", "web", false)
	a.RegisterInstance(own, "web-3", "web", true)
	a.RegisterInstance("ext-1", "db-1", "db", true)

	want := []string{"ext-1/web-1", own + "/web-3"}
	slices.Sort(want)
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return slices.Equal(passing(t, a, "web"), want) }, "web passing = %v", want))

	a.SetCheck("ext-2", "web-2", true)
	a.SetCheck(own, "web-3", false)
	want = []string{"ext-1/web-1", "ext-2/web-2"}
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return slices.Equal(passing(t, a, "web"), want) }, "after SetCheck, web passing = %v", want))

	a.Deregister("ext-1", "web-1")
	a.Deregister(own, "web-3")
	want = []string{"ext-2/web-2"}
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return slices.Equal(passing(t, a, "web"), want) }, "after Deregister, web passing = %v", want))
	if got := passing(t, a, "db"); !slices.Equal(got, []string{"ext-1/db-1"}) {
		t.Fatalf("db passing = %v, want only ext-1/db-1", got)
	}

	a.Stop()
	if _, err := net.Dial("tcp", a.Addr()); err == nil {
		t.Fatalf("%s still accepts connections after Stop", a.Addr())
	}
	a.Stop() // stopping twice is harmless

	addr := a.Addr()
	a.Restart()
	if a.Addr() != addr {
		t.Fatalf("Restart moved the agent from %s to %s", addr, a.Addr())
	}
	if got := passing(t, a, "web"); len(got) != 0 {
		t.Fatalf("restarted agent still lists %v; want an empty catalog", got)
	}
	a.RegisterInstance("ext-9", "web-9", "web", true)
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool { return slices.Equal(passing(t, a, "web"), []string{"ext-9/web-9"}) }, "restarted agent lists ext-9/web-9"))
}

func TestParallelAgentsDoNotCollide(t *testing.T) {
	t.Parallel()
	a, b := Start(t, WithNode("left")), Start(t, WithNode("right"))
	if a.Addr() == b.Addr() {
		t.Fatalf("two agents share %s", a.Addr())
	}
	for _, ag := range []*Agent{a, b} {
		got, err := ag.Client().Agent().NodeName()
		if err != nil || got != ag.NodeName() {
			t.Errorf("agent at %s is node %q (%v), want %q", ag.Addr(), got, err, ag.NodeName())
		}
	}
	a.RegisterInstance("n", "s-1", "s", true)
	if got := passing(t, b, "s"); len(got) != 0 {
		t.Fatalf("agent %s sees %v registered on the other agent", b.NodeName(), got)
	}
}

func TestFindBinary(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	fake := filepath.Join(dir, "consul")
	if err := os.WriteFile(fake, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		env     string
		want    string
		wantErr string
	}{
		{name: "env names an existing file", env: fake, want: fake},
		{name: "env names a missing file", env: filepath.Join(dir, "nope"), wantErr: "$" + BinaryEnv},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := findBinary(tc.env)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("findBinary(%q) = %q, %v; want an error mentioning %q", tc.env, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("findBinary(%q) = %q, %v; want %q", tc.env, got, err, tc.want)
			}
		})
	}
}

func TestModuleRootIsMainModule(t *testing.T) {
	t.Parallel()
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, installer)); err != nil {
		t.Fatalf("module root %s has no %s: %v", root, installer, err)
	}
}

func TestModuleName(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, gomod, want string }{
		{"plain", "module github.com/sharelimit/sharelimit\n\ngo 1.26\n", modulePath},
		{"quoted", "// comment\nmodule \"github.com/sharelimit/sharelimit\"\n", modulePath},
		{"nested tool module", "module github.com/sharelimit/sharelimit/tools/consul\n", modulePath + "/tools/consul"},
		{"no module line", "go 1.20\n", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := moduleName(strings.NewReader(tc.gomod)); got != tc.want {
				t.Fatalf("moduleName = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestAgentHelpersReachCatalogNotAgentForExternalNodes(t *testing.T) {
	t.Parallel()
	a := Start(t)
	a.RegisterInstance("elsewhere", "x-1", "x", true)
	services, err := a.Client().Agent().Services()
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := services["x-1"]; ok {
		t.Fatalf("an external node's instance was registered with the local agent")
	}
	var nodes []*api.Node
	testutil.Eventually(t, 30*time.Second, testutil.Cond(func() bool {
		nodes, _, err = a.Client().Catalog().Nodes(nil)
		return err == nil && slices.ContainsFunc(nodes, func(n *api.Node) bool { return n.Node == "elsewhere" })
	}, "catalog lists node elsewhere"))
}
