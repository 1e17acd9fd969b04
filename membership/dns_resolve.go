package membership

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
)

// resolver resolves through server over TCP, or through the system's
// nameservers when server is "".
type resolver string

// lookup returns the A and AAAA records of name, asked for separately: a
// family with no record (NXDOMAIN or NODATA for its type) is empty, and
// any other failure of either (SERVFAIL, REFUSED, no answer in time, a
// garbled answer) fails the whole lookup. Go's resolver, asked for "ip",
// returns the family that answered and drops the other's error, and a
// count of half the replicas would double every share. StrictErrors makes
// a temporary failure of any name tried on the search list fail the
// family, rather than be passed over for a later name's "not found". An
// IP address given as the name is its one address.
func (server resolver) lookup(ctx context.Context, name string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(name); err == nil {
		return []netip.Addr{a}, nil
	}
	// The Go resolver, whichever the platform's default: StrictErrors is
	// its alone, and the binary is built without cgo anyway.
	r := &net.Resolver{PreferGo: true, StrictErrors: true}
	if server != "" {
		// Every query (to whichever nameserver resolv.conf lists) is
		// sent to server over TCP: a stream answer is never cut to fit
		// a datagram.
		r.Dial = func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", string(server))
		}
	}
	var v4, v6 []netip.Addr
	var err4, err6 error
	var wg sync.WaitGroup
	wg.Go(func() { v4, err4 = r.LookupNetIP(ctx, "ip4", name) })
	v6, err6 = r.LookupNetIP(ctx, "ip6", name)
	wg.Wait()
	for _, err := range []error{err4, err6} {
		if de := (*net.DNSError)(nil); server != "" && errors.As(err, &de) {
			// The error names the nameserver resolv.conf lists, which
			// was never asked.
			de.Server = string(server)
		}
	}
	empty4, empty6 := notFound(err4), notFound(err6)
	switch {
	case err4 != nil && !empty4:
		return nil, fmt.Errorf("A records: %w", err4)
	case err6 != nil && !empty6:
		return nil, fmt.Errorf("AAAA records: %w", err6)
	case empty4 && empty6:
		return nil, err4
	}
	return append(v4, v6...), nil
}

// notFound reports whether err says that the name has no record of the
// type asked: NXDOMAIN or NODATA, or an address in /etc/hosts of the other
// family only.
func notFound(err error) bool {
	var de *net.DNSError
	var ae *net.AddrError
	return errors.As(err, &de) && de.IsNotFound || errors.As(err, &ae) && ae.Err == "no suitable address found"
}

// interfaceAddrs lists the addresses of this host's interfaces.
func interfaceAddrs() ([]netip.Addr, error) {
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, err
	}
	out := make([]netip.Addr, 0, len(ifaddrs))
	for _, ia := range ifaddrs {
		if n, ok := ia.(*net.IPNet); ok {
			if a, ok := netip.AddrFromSlice(n.IP); ok {
				out = append(out, a)
			}
		}
	}
	return out, nil
}

// refreshOwn lists this host's addresses again; on an error the last list
// stands.
func (s *DNS) refreshOwn(ctx context.Context) {
	addrs, err := s.localAddrs()
	if err != nil {
		s.log.Log(ctx, slog.LevelDebug, "dns membership: this host's addresses not listed; the last list stands", "error", err)
		return
	}
	clear(s.own)
	for _, a := range addrs {
		if a.IsValid() && !a.IsUnspecified() {
			s.own[a.Unmap().WithZone("")] = struct{}{}
		}
	}
}

// countAddrs is how many distinct addresses addrs holds; an IPv4 address
// and its IPv4-mapped IPv6 form are one.
func countAddrs(addrs []netip.Addr) int { return len(distinctAddrs(addrs)) }

// distinctAddrs is the set of the valid addresses in addrs, each unmapped
// and without its zone.
func distinctAddrs(addrs []netip.Addr) map[netip.Addr]struct{} {
	seen := make(map[netip.Addr]struct{}, len(addrs))
	for _, a := range addrs {
		if a.IsValid() {
			seen[a.Unmap().WithZone("")] = struct{}{}
		}
	}
	return seen
}
