package redistest

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

const (
	// sentinelReadyTimeout bounds the wait for a replicated, watched
	// primary and for a failover.
	sentinelReadyTimeout = 60 * time.Second
	// SentinelDownAfter is how long a primary must not answer before a
	// sentinel thinks it is down (down-after-milliseconds).
	SentinelDownAfter = time.Second
)

// Sentinel is a primary, its replicas and three Sentinels watching it,
// started for a test by StartSentinel; every one is a Server of its own, so
// a test can kill, pause or restart any of them.
type Sentinel struct {
	// MasterName is the name the Sentinels know the primary by.
	MasterName string
	data       []*Server // the first one is the first primary
	sentinels  []*Server
	alias      map[string]*Server // the address replicas and Sentinels use for the first primary

	mu       sync.Mutex
	password string // of the data servers, once RequirePass set it
}

// StartSentinel starts a primary, replicas replicas of it (each started
// with --replicaof) and three Sentinels (redis-server --sentinel, quorum
// 2, down-after-milliseconds 1000, failover-timeout 10000) that monitor it
// as "mymaster", all on free loopback ports with their own directories. It
// waits (at most 60s) until every replica is online and every Sentinel
// knows the replicas and the two other Sentinels. args are given to the
// primary and the replicas. Every process is killed when the test ends.
func StartSentinel(t testing.TB, replicas int, args ...string) *Sentinel {
	t.Helper()
	return StartSentinelVia(t, replicas, nil, args...)
}

// StartSentinelVia is StartSentinel where the replicas replicate from, and
// the Sentinels monitor, the primary at the address via returns for the
// primary's own address (for example a TCP proxy that the test can cut,
// partitioning the primary from the replicas and the Sentinels while its
// clients, which connect to Data()[0].Addr(), still reach it). A nil via
// is StartSentinel. Primary and WaitFailover know the primary by either
// address.
func StartSentinelVia(t testing.TB, replicas int, via func(addr string) string, args ...string) *Sentinel {
	t.Helper()
	s := &Sentinel{MasterName: "mymaster", alias: map[string]*Server{}}
	primary := start(t, args)
	s.data = append(s.data, primary)
	watched := primary.Addr()
	if via != nil {
		watched = via(primary.Addr())
		s.alias[watched] = primary
	}
	for range replicas {
		host, port, _ := strings.Cut(watched, ":")
		s.data = append(s.data, start(t, append(append([]string(nil), args...), "--replicaof", host, port)))
	}
	conf := fmt.Sprintf("sentinel monitor %[1]s %[2]s 2\nsentinel down-after-milliseconds %[1]s %[3]d\nsentinel failover-timeout %[1]s 10000\nsentinel parallel-syncs %[1]s 1\n",
		s.MasterName, strings.Replace(watched, ":", " ", 1), SentinelDownAfter.Milliseconds())
	for range 3 {
		s.sentinels = append(s.sentinels, startConf(t, conf, []string{"--sentinel"}))
	}
	s.waitFor(t, "a replicated primary watched by 3 sentinels", func() error {
		return s.healthy(primary.Addr(), replicas)
	})
	return s
}

// RequirePass sets password on every data server (requirepass, and
// masterauth so that replicas still sync) and tells every Sentinel
// (SENTINEL SET auth-pass), as an operator would; the harness's own
// commands to the data servers authenticate from then on.
func (s *Sentinel) RequirePass(t testing.TB, password string) {
	t.Helper()
	for _, d := range s.data {
		d.Do(t, "CONFIG", "SET", "masterauth", password)
	}
	for _, n := range s.sentinels {
		n.Do(t, "SENTINEL", "SET", s.MasterName, "auth-pass", password)
	}
	for _, d := range s.data {
		d.Do(t, "CONFIG", "SET", "requirepass", password)
	}
	s.mu.Lock()
	s.password = password
	s.mu.Unlock()
}

// dataCommand is Command on a data server, authenticated once RequirePass
// set a password.
func (s *Sentinel) dataCommand(d *Server, args ...string) (string, error) {
	s.mu.Lock()
	pw := s.password
	s.mu.Unlock()
	if pw == "" {
		return d.Command(args...)
	}
	replies, err := roundTrip(d.Addr(), commandTimeout, []string{"AUTH", pw}, args)
	if err != nil {
		return "", err
	}
	for _, r := range replies {
		if e, ok := r.(ReplyError); ok {
			return "", e
		}
	}
	var b strings.Builder
	render(&b, replies[1])
	return strings.TrimSpace(b.String()), nil
}

// Data returns the primary and the replicas, in the order they were
// started (the first primary first); which one is the primary now is
// Primary's answer. The slice is a copy.
func (s *Sentinel) Data() []*Server { return append([]*Server(nil), s.data...) }

// SentinelAddrs returns the addresses of the three Sentinels.
func (s *Sentinel) SentinelAddrs() []string {
	out := make([]string, len(s.sentinels))
	for i, n := range s.sentinels {
		out[i] = n.Addr()
	}
	return out
}

// Sentinels returns the Sentinel servers. The slice is a copy.
func (s *Sentinel) Sentinels() []*Server { return append([]*Server(nil), s.sentinels...) }

// Primary returns the data server that the first Sentinel that answers
// names as the primary (SENTINEL GET-MASTER-ADDR-BY-NAME), or nil.
func (s *Sentinel) Primary() *Server {
	addr, err := s.primaryAddr()
	if err != nil {
		return nil
	}
	return s.server(addr)
}

// WaitFailover waits (at most 60s) until every Sentinel names a primary
// other than old, and that server answers as a primary (INFO replication
// role:master); it returns the new primary.
func (s *Sentinel) WaitFailover(t testing.TB, old *Server) *Server {
	t.Helper()
	var next *Server
	s.waitFor(t, "a failover from "+old.Addr(), func() error {
		var named string
		for _, n := range s.sentinels {
			if !n.running() {
				continue
			}
			reply, err := n.Command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterName)
			if err != nil {
				return err
			}
			addr := strings.Replace(reply, "\n", ":", 1)
			if s.server(addr) == old {
				return fmt.Errorf("sentinel %s still names %s", n.Addr(), addr)
			}
			if named != "" && addr != named {
				return fmt.Errorf("the sentinels name %s and %s", named, addr)
			}
			named = addr
		}
		srv := s.server(named)
		if srv == nil {
			return fmt.Errorf("the sentinels name %s, which is none of the data servers", named)
		}
		info, err := s.dataCommand(srv, "INFO", "replication")
		if err != nil {
			return err
		}
		if role := infoField(info, "role"); role != "master" {
			return fmt.Errorf("%s has role %s", named, role)
		}
		next = srv
		return nil
	})
	return next
}

// running reports whether the server's process is running (not killed or
// stopped by the test).
func (s *Server) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.proc != nil
}

func (s *Sentinel) primaryAddr() (string, error) {
	var lastErr error
	for _, n := range s.sentinels {
		reply, err := n.Command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", s.MasterName)
		if err == nil {
			return strings.Replace(reply, "\n", ":", 1), nil
		}
		lastErr = err
	}
	return "", lastErr
}

func (s *Sentinel) server(addr string) *Server {
	if d, ok := s.alias[addr]; ok {
		return d
	}
	for _, d := range s.data {
		if d.Addr() == addr {
			return d
		}
	}
	return nil
}

// WaitHealthy waits (at most 60s) until the current primary has every
// other running data server online as its replica, and every Sentinel sees
// it so and is out of TILT mode (a Sentinel whose timer was late by 2 s
// does nothing for 30 s). Call it before killing the primary, so that the
// failover does not wait for a Sentinel.
func (s *Sentinel) WaitHealthy(t testing.TB) {
	t.Helper()
	s.waitFor(t, "a replicated primary watched by 3 sentinels", func() error {
		addr, err := s.primaryAddr()
		if err != nil {
			return err
		}
		replicas := -1
		for _, d := range s.data {
			if d.running() {
				replicas++
			}
		}
		return s.healthy(addr, replicas)
	})
}

// healthy reports whether primary has replicas online replicas and every
// Sentinel sees it as a primary with those replicas and 2 other Sentinels,
// out of TILT mode.
func (s *Sentinel) healthy(primary string, replicas int) error {
	info, err := s.dataCommand(s.server(primary), "INFO", "replication")
	if err != nil {
		return err
	}
	if got := infoField(info, "connected_slaves"); got != strconv.Itoa(replicas) {
		return fmt.Errorf("%s has %s connected replicas, want %d", primary, got, replicas)
	}
	for i := range replicas {
		if v := infoField(info, "slave"+strconv.Itoa(i)); !strings.Contains(v, "state=online") {
			return fmt.Errorf("%s: replica %d is %q", primary, i, v)
		}
	}
	for _, n := range s.sentinels {
		reply, err := n.Command("SENTINEL", "MASTER", s.MasterName)
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", n.Addr(), err)
		}
		f := pairs(reply)
		if f["flags"] != "master" || f["num-slaves"] != strconv.Itoa(replicas) || f["num-other-sentinels"] != "2" {
			return fmt.Errorf("sentinel %s sees flags=%s num-slaves=%s num-other-sentinels=%s", n.Addr(), f["flags"], f["num-slaves"], f["num-other-sentinels"])
		}
		info, err := n.Command("INFO", "sentinel")
		if err != nil {
			return fmt.Errorf("sentinel %s: %w", n.Addr(), err)
		}
		if tilt := infoField(info, "sentinel_tilt"); tilt != "0" {
			return fmt.Errorf("sentinel %s is in TILT mode (sentinel_tilt:%s)", n.Addr(), tilt)
		}
	}
	return nil
}

// pairs reads a flat name/value reply, one element per line as Command
// formats it.
func pairs(reply string) map[string]string {
	lines := strings.Split(reply, "\n")
	out := make(map[string]string, len(lines)/2)
	for i := 0; i+1 < len(lines); i += 2 {
		out[lines[i]] = lines[i+1]
	}
	return out
}

func (s *Sentinel) waitFor(t testing.TB, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(sentinelReadyTimeout)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: no %s after %v: %v", what, sentinelReadyTimeout, err)
		}
		time.Sleep(50 * time.Millisecond) // poll the servers until the deadline
	}
}
