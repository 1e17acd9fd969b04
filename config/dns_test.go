package config

import (
	"io"
	"strings"
	"testing"
	"time"
)

func TestPeersDNSSettings(t *testing.T) {
	t.Parallel()
	c, err := Parse("serve", nil, env(map[string]string{
		"SHARELIMIT_PEERS_DNS": "sharelimit-peers.default.svc.cluster.local", "SHARELIMIT_PEERS_DNS_SERVER": "10.0.0.10:53",
		"SHARELIMIT_PEERS_DNS_INTERVAL": "2",
	}), io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.PeersDNS != "sharelimit-peers.default.svc.cluster.local" || c.PeersDNSServer != "10.0.0.10:53" || c.PeersDNSInterval != 2*time.Second {
		t.Fatalf("from the environment: name %q server %q interval %s", c.PeersDNS, c.PeersDNSServer, c.PeersDNSInterval)
	}
	if d := Defaults(); d.PeersDNS != "" || d.PeersDNSServer != "" || d.PeersDNSInterval != 5*time.Second {
		t.Fatalf("defaults: name %q server %q interval %s", d.PeersDNS, d.PeersDNSServer, d.PeersDNSInterval)
	}
}

func TestPeersDNSErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cases := []struct {
		name string
		args []string
		want string // "" = valid
	}{
		{"a headless Service", []string{"--peers-dns", "rl-peers.default.svc.cluster.local"}, ""},
		{"a short compose name", []string{"--peers-dns", "ratelimit"}, ""},
		{"Consul DNS over TCP, absolute", []string{"--peers-dns", "rl.service.consul.", "--peers-dns-server", "127.0.0.1:8600", "--peers-dns-interval", "100ms"}, ""},
		{"an IPv6 server", []string{"--peers-dns", "rl", "--peers-dns-server", "[fd00::10]:53"}, ""},
		{"with --consul-service", []string{"--peers-dns", "rl", "--consul-service", "rl"},
			"--peers-dns: --peers-dns and --consul-service are two membership sources; give one"},
		{"with --domain-service", []string{"--peers-dns", "rl", "--domain-service", "a=svc"},
			"--peers-dns: --domain-service divides domains by Consul services, and --peers-dns is not Consul"},
		{"with demand sharing", []string{"--peers-dns", "rl", "--share-mode", "demand"},
			"--share-mode: demand needs Consul: replicas publish their demand through Consul KV, and --peers-dns gives no Consul"},
		{"with --node", []string{"--peers-dns", "rl", "--node", "n1"}, "--node: has no effect without --consul-service"},
		{"a space", []string{"--peers-dns", "rl peers"}, `--peers-dns: "rl peers": ' ' is not a letter`},
		{"an empty label", []string{"--peers-dns", "rl..svc"}, "a label is empty"},
		{"only a dot", []string{"--peers-dns", "."}, "a label is empty"},
		{"a label too long", []string{"--peers-dns", strings.Repeat("a", 64) + ".svc"}, "longer than 63"},
		{"a URL", []string{"--peers-dns", "dns://rl"}, `':' is not a letter`},
		{"server without port", []string{"--peers-dns", "rl", "--peers-dns-server", "127.0.0.1"}, `--peers-dns-server: want host:port, got "127.0.0.1"`},
		{"server port 0", []string{"--peers-dns", "rl", "--peers-dns-server", "127.0.0.1:0"}, `--peers-dns-server: bad port "0"`},
		{"server without --peers-dns", []string{"--peers-dns-server", "127.0.0.1:8600"}, "--peers-dns-server: has no effect without --peers-dns"},
		{"interval without --peers-dns", []string{"--peers-dns-interval", "1s"}, "--peers-dns-interval: has no effect without --peers-dns"},
		{"interval too short", []string{"--peers-dns", "rl", "--peers-dns-interval", "10ms"}, "--peers-dns-interval: must be between 100ms and 10m0s, got 10ms"},
		{"interval too long", []string{"--peers-dns", "rl", "--peers-dns-interval", "1h"}, "--peers-dns-interval: must be between"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c, err := Parse("serve", append([]string{"--config-dir", dir}, tc.args...), env(nil), io.Discard)
			if err == nil {
				err = c.Validate()
			}
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("got %v, want %q", err, tc.want)
			}
		})
	}
}
