package redistest

import (
	"fmt"
	"net"
	"strconv"
	"sync"
)

// busOffset is the distance from a node's port to its cluster bus port.
const busOffset = 10000

// portTries bounds how many ports pickPort asks the kernel for.
const portTries = 200

// handedOut holds every port that pickPort has returned in this process. A
// port is never handed out twice, even after its server is killed: that
// server may be restarted on it, and two parallel tests must not race for
// the same port.
var handedOut struct {
	sync.Mutex
	ports map[int]bool
}

// pickPort returns a loopback port that is free now and whose cluster bus
// port (port+10000) is free too, so that it fits both plain and cluster
// servers. The port is only free when pickPort looks: another process may
// take it before redis-server binds it, which the callers handle by
// retrying.
func pickPort() (int, error) {
	handedOut.Lock()
	defer handedOut.Unlock()
	for range portTries {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("find a free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		if port+busOffset > 65535 || handedOut.ports[port] || handedOut.ports[port+busOffset] {
			l.Close()
			continue
		}
		bus, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+busOffset))
		l.Close()
		if err != nil {
			continue
		}
		bus.Close()
		if handedOut.ports == nil {
			handedOut.ports = make(map[int]bool)
		}
		handedOut.ports[port] = true
		return port, nil
	}
	return 0, fmt.Errorf("no free port below %d with a free cluster bus port after %d tries", 65535-busOffset+1, portTries)
}
