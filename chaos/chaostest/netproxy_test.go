package chaostest

import (
	"bufio"
	"io"
	"net"
	"testing"
	"time"
)

// echoServer is a loopback TCP server that writes back every line it reads.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip sends a line through addr and reads it back.
func roundTrip(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	_, err = bufio.NewReader(c).ReadString('\n')
	return err
}

// TestNetProxyCutKeepsItsPort: while a proxy is cut (Disable), its port
// stays its own, so another listener cannot take it and Enable always
// heals the proxy on the same address. The test takes the part of the
// other process.
func TestNetProxyCutKeepsItsPort(t *testing.T) {
	px := StartNetProxy(t, echoServer(t))
	if err := roundTrip(px.Addr()); err != nil {
		t.Fatalf("before the cut: %v", err)
	}
	for range 3 {
		px.Disable()
		if ln, err := net.Listen("tcp", px.Addr()); err == nil {
			ln.Close()
			t.Fatalf("another listener took %s during the cut", px.Addr())
		}
		if err := roundTrip(px.Addr()); err == nil {
			t.Fatal("a round trip passed during the cut")
		}
		px.Enable(t)
		if err := roundTrip(px.Addr()); err != nil {
			t.Fatalf("after the cut: %v", err)
		}
	}
}

// TestNetProxyCutClosesOpenConnections: Disable closes the connections
// already through the proxy.
func TestNetProxyCutClosesOpenConnections(t *testing.T) {
	px := StartNetProxy(t, echoServer(t))
	c, err := net.Dial("tcp", px.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	if _, err := c.Write([]byte("ping\n")); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	px.Disable()
	defer px.Enable(t)
	if _, err := r.ReadString('\n'); err == nil {
		t.Fatal("the open connection still reads after the cut")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the open connection was not closed by the cut: %v", err)
	}
}

// TestNetProxySetUpstream: connections accepted after SetUpstream go to the
// new upstream.
func TestNetProxySetUpstream(t *testing.T) {
	px := StartNetProxy(t, "")
	if err := roundTrip(px.Addr()); err == nil {
		t.Fatal("a round trip passed with no upstream")
	}
	px.SetUpstream(echoServer(t))
	if err := roundTrip(px.Addr()); err != nil {
		t.Fatalf("after SetUpstream: %v", err)
	}
}
