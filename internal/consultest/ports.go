package consultest

import (
	"io"
	"net"
	"strconv"
	"sync"
)

// freePorts finds n loopback ports free for both TCP and UDP (serf and DNS
// use both), none handed out before by this process. Another process can
// still take one before the agent binds it; Start retries then.
func freePorts(n int) ([]int, error) {
	ports := make([]int, n)
	var held []io.Closer
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	for i := 0; i < len(ports); {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return ports, err
		}
		held = append(held, l)
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		held = append(held, u)
		if !claimPort(port) {
			continue
		}
		ports[i] = port
		i++
	}
	return ports, nil
}

var claimed = struct {
	sync.Mutex
	ports map[int]bool
}{ports: map[int]bool{}}

func claimPort(port int) bool {
	claimed.Lock()
	defer claimed.Unlock()
	if claimed.ports[port] {
		return false
	}
	claimed.ports[port] = true
	return true
}
