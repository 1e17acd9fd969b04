package config

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Bounds of --peers-dns-interval: faster costs the DNS server more than a
// share gains from it; slower leaves a scale-up unseen for longer than a
// replica's start takes.
const (
	MinPeersDNSInterval = 100 * time.Millisecond
	MaxPeersDNSInterval = 10 * time.Minute
)

// validatePeersDNS checks --peers-dns and its settings, reporting through
// bad. DNS membership is one source for every domain, and not Consul: it
// excludes --consul-service, --domain-service and demand sharing, which
// publishes through Consul KV.
func (c *Config) validatePeersDNS(bad func(flag, format string, args ...any)) {
	if c.PeersDNS == "" {
		if c.PeersDNSServer != "" {
			bad("peers-dns-server", "has no effect without --peers-dns")
		}
		if c.PeersDNSInterval != Defaults().PeersDNSInterval {
			bad("peers-dns-interval", "has no effect without --peers-dns")
		}
		return
	}
	if err := checkDNSName(c.PeersDNS); err != "" {
		bad("peers-dns", "%q: %s", c.PeersDNS, err)
	}
	if c.ConsulService != "" {
		bad("peers-dns", "--peers-dns and --consul-service are two membership sources; give one: --peers-dns counts the addresses a name resolves to, --consul-service a Consul service's passing instances")
	}
	if len(c.DomainServices) > 0 {
		bad("peers-dns", "--domain-service divides domains by Consul services, and --peers-dns is not Consul; give --consul-service instead, or drop --domain-service")
	}
	if c.ShareMode == ShareDemand {
		bad("share-mode", "demand needs Consul: replicas publish their demand through Consul KV, and --peers-dns gives no Consul; use --share-mode cluster with --peers-dns, or --consul-service for membership")
	}
	if c.PeersDNSServer != "" {
		host, port, err := net.SplitHostPort(c.PeersDNSServer)
		if err != nil || host == "" {
			bad("peers-dns-server", "want host:port, got %q", c.PeersDNSServer)
		} else if _, err := strconv.ParseUint(port, 10, 16); err != nil || port == "0" {
			bad("peers-dns-server", "bad port %q", port)
		}
	}
	if c.PeersDNSInterval < MinPeersDNSInterval || c.PeersDNSInterval > MaxPeersDNSInterval {
		bad("peers-dns-interval", "must be between %s and %s, got %s", MinPeersDNSInterval, MaxPeersDNSInterval, c.PeersDNSInterval)
	}
}

// checkDNSName says what keeps name from being a host name to resolve, ""
// if nothing does: at most 253 characters, an optional final ".", and
// labels of 1 to 63 letters, digits, '-' and '_'.
func checkDNSName(name string) string {
	n := strings.TrimSuffix(name, ".")
	if len(n) > 253 {
		return "longer than 253 characters"
	}
	for _, label := range strings.Split(n, ".") {
		if label == "" || len(label) > 63 {
			return "a label is empty or longer than 63 characters"
		}
		for _, r := range label {
			if !(r == '-' || r == '_' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
				return fmt.Sprintf("%q is not a letter, digit, '-', '_' or '.'", r)
			}
		}
	}
	return ""
}
