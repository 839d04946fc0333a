package storeopen

import (
	"bufio"
	"net"
	"path/filepath"
	"strings"
	"testing"
)

// serveLine accepts connections on a loopback port and answers each
// request line with answer; it returns the address.
func serveLine(t *testing.T, answer string) string {
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
				bufio.NewReader(c).ReadString('\n')
				c.Write([]byte(answer))
			}()
		}
	}()
	return ln.Addr().String()
}

func TestProbeRESP(t *testing.T) {
	for _, tt := range []struct {
		answer, want string
	}{
		{"+PONG\r\n", ""},
		{"-NOAUTH Authentication required.\r\n", ""},
		{"HTTP/1.1 400 Bad Request\r\n", "is not a Redis server: it answered \"HTTP/1.1 400 Bad Request\" to PING, as an HTTP server does"},
		{"SSH-2.0-OpenSSH_9.6\r\n", "is not a Redis server"},
	} {
		addr := serveLine(t, tt.answer)
		err := ProbeRESP(t.Context(), "tcp", addr, nil)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("answer %q: got %v, want nil", tt.answer, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("answer %q: got %v, want an error with %q", tt.answer, err, tt.want)
		}
	}
	// Nothing listening: not the probe's question.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	if err := (Probe{Addrs: []string{addr}}).NotRedis(t.Context()); err != nil {
		t.Errorf("closed port: got %v, want nil", err)
	}
}

func TestBolt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "data", "idem.db")
	if _, err := Bolt(path, false); err == nil || !strings.Contains(err.Error(), "no embedded store at "+path) {
		t.Fatalf("missing store without create: got %v, want no embedded store at %s", err, path)
	}
	st, err := Bolt(path, true)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	es, err := st.List(ctx, 10)
	if err != nil || len(es) != 0 {
		t.Errorf("List of a new store: got %+v, %v, want none", es, err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if st, err = Bolt(path, false); err != nil {
		t.Fatalf("existing store: %v", err)
	}
	st.Close()
}
