package testutil

import (
	"net"
	"sync"
	"testing"
)

// claimed holds the ports FreeAddr has handed out in this process, so two
// listeners started back to back never get the same one.
var claimed = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

// FreeAddr returns "127.0.0.1:port" for a TCP port nothing listened on a
// moment ago and that no earlier call in this process returned. Another
// process may still take it before the caller binds it; callers that start a
// child process on it retry with a new one when that happens.
func FreeAddr(t testing.TB) string {
	t.Helper()
	for {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("find a free port: %v", err)
		}
		addr := l.Addr().(*net.TCPAddr)
		l.Close()
		claimed.Lock()
		taken := claimed.ports[addr.Port]
		claimed.ports[addr.Port] = true
		claimed.Unlock()
		if !taken {
			return addr.String()
		}
	}
}
