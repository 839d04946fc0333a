package redistest

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

const (
	// clusterSlots is the number of hash slots of a Redis Cluster.
	clusterSlots = 16384
	// clusterCreateTimeout bounds redis-cli --cluster create.
	clusterCreateTimeout = 60 * time.Second
	// clusterReadyTimeout bounds the wait for a healthy cluster.
	clusterReadyTimeout = 30 * time.Second
	// clusterFailoverTimeout bounds the wait for a replica's promotion.
	clusterFailoverTimeout = 60 * time.Second
)

// Cluster is a Redis Cluster of masters without replicas, started for a test
// by StartCluster. Each node is a Server of its own, so a test can kill,
// pause or restart one node; a restarted node keeps its identity through the
// nodes.conf in its directory.
type Cluster struct {
	nodes []*Server
	ids   []string // CLUSTER MYID of each node
	first []string // the master of each node when the cluster was made ("" for a master)
}

// StartCluster starts masters redis-server nodes (at least 3, as
// redis-cli requires) with cluster mode on, each on its own free port whose
// bus port (port+10000) is free too and in its own directory, joins them
// with redis-cli --cluster create (the slots are split evenly, no replicas),
// and waits (at most 30s) until the cluster is healthy as Cluster.WaitOK
// defines it. The nodes are killed when the test ends.
//
// args are extra redis-server options given to every node, as for Start;
// for example "--cluster-node-timeout", "2000" makes a killed node count as
// failed sooner than the default 15s.
func StartCluster(t testing.TB, masters int, args ...string) *Cluster {
	t.Helper()
	return startCluster(t, masters, 0, args)
}

// StartClusterReplicas is StartCluster with replicas replicas of each
// master: masters*(1+replicas) nodes, joined with redis-cli --cluster
// create --cluster-replicas. WaitOK then also waits until every replica's
// link to its master is up. Which node is a master is Masters' answer.
func StartClusterReplicas(t testing.TB, masters, replicas int, args ...string) *Cluster {
	t.Helper()
	return startCluster(t, masters, replicas, args)
}

func startCluster(t testing.TB, masters, replicas int, args []string) *Cluster {
	t.Helper()
	if masters < 3 {
		t.Fatalf("redistest: a Redis Cluster needs at least 3 masters, got %d", masters)
	}
	nodeArgs := append([]string{
		"--cluster-enabled", "yes",
		"--cluster-config-file", "nodes.conf",
	}, args...)
	c := &Cluster{}
	for range masters * (1 + replicas) {
		c.nodes = append(c.nodes, start(t, nodeArgs))
	}

	ctx, cancel := context.WithTimeout(t.Context(), clusterCreateTimeout)
	defer cancel()
	cliArgs := append([]string{"--cluster", "create"}, c.Addrs()...)
	cliArgs = append(cliArgs, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	out, err := exec.CommandContext(ctx, "redis-cli", cliArgs...).CombinedOutput()
	if err != nil {
		t.Fatalf("redistest: redis-cli %s: %v\n%s", strings.Join(cliArgs, " "), err, out)
	}
	c.WaitOK(t)
	for _, n := range c.nodes {
		c.ids = append(c.ids, n.Do(t, "CLUSTER", "MYID"))
	}
	for _, n := range c.nodes {
		c.first = append(c.first, c.masterID(t, n))
	}
	return c
}

// masterID returns the ID of n's master in n's own CLUSTER NODES, or ""
// if n is a master.
func (c *Cluster) masterID(t testing.TB, n *Server) string {
	t.Helper()
	for line := range strings.Lines(n.Do(t, "CLUSTER", "NODES")) {
		fields := strings.Fields(line)
		if len(fields) >= 4 && strings.Contains(fields[2], "myself") {
			if fields[3] == "-" {
				return ""
			}
			return fields[3]
		}
	}
	t.Fatalf("redistest: %s lists no myself line in CLUSTER NODES", n.Addr())
	return ""
}

// Masters returns the nodes that were masters when the cluster was made.
func (c *Cluster) Masters() []*Server {
	var out []*Server
	for i, n := range c.nodes {
		if c.first[i] == "" {
			out = append(out, n)
		}
	}
	return out
}

// WaitFailover waits (at most 60s) until one of the nodes that were
// replicas of old when the cluster was made answers as a master (INFO
// replication role:master) and every running node reports
// cluster_state:ok with all 16384 slots assigned and lists old with the
// fail flag; it returns the promoted node. Call it after killing or pausing
// old. It fails the test with the last node's view if that does not happen
// in time; every probe is bounded by the command timeout.
func (c *Cluster) WaitFailover(t testing.TB, old *Server) *Server {
	t.Helper()
	oldID := ""
	for i, n := range c.nodes {
		if n == old {
			oldID = c.ids[i]
		}
	}
	if oldID == "" {
		t.Fatalf("redistest: %s is not a node of the cluster", old.Addr())
	}
	deadline := time.Now().Add(clusterFailoverTimeout)
	for {
		promoted, err := c.failedOver(old, oldID)
		if err == nil {
			return promoted
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: no failover from %s within %v: %v", old.Addr(), clusterFailoverTimeout, err)
		}
		time.Sleep(50 * time.Millisecond) // poll the nodes until the deadline
	}
}

// failedOver returns the promoted replica of old, or an error that says
// what is not yet so.
func (c *Cluster) failedOver(old *Server, oldID string) (*Server, error) {
	var promoted *Server
	for i, n := range c.nodes {
		if c.first[i] != oldID || !n.running() {
			continue
		}
		info, err := n.Command("INFO", "replication")
		if err != nil {
			return nil, fmt.Errorf("%s: INFO replication: %w", n.Addr(), err)
		}
		if infoField(info, "role") == "master" {
			promoted = n
		}
	}
	if promoted == nil {
		return nil, fmt.Errorf("no replica of %s is a master yet", old.Addr())
	}
	for _, n := range c.nodes {
		if n == old || !n.running() {
			continue
		}
		info, err := n.Command("CLUSTER", "INFO")
		if err != nil {
			return nil, fmt.Errorf("%s: CLUSTER INFO: %w", n.Addr(), err)
		}
		if got := infoField(info, "cluster_state"); got != "ok" {
			return nil, fmt.Errorf("%s: cluster_state:%s, want ok", n.Addr(), got)
		}
		if got, want := infoField(info, "cluster_slots_assigned"), strconv.Itoa(clusterSlots); got != want {
			return nil, fmt.Errorf("%s: cluster_slots_assigned:%s, want %s", n.Addr(), got, want)
		}
		nodes, err := n.Command("CLUSTER", "NODES")
		if err != nil {
			return nil, fmt.Errorf("%s: CLUSTER NODES: %w", n.Addr(), err)
		}
		for line := range strings.Lines(nodes) {
			fields := strings.Fields(line)
			if len(fields) >= 3 && fields[0] == oldID && !slices.Contains(strings.Split(fields[2], ","), "fail") {
				return nil, fmt.Errorf("%s sees %s as %s, want fail", n.Addr(), old.Addr(), fields[2])
			}
		}
	}
	return promoted, nil
}

// Addrs returns the addresses of the nodes, "127.0.0.1:port", in the order
// they were started. They do not change across node restarts.
func (c *Cluster) Addrs() []string {
	addrs := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		addrs[i] = n.Addr()
	}
	return addrs
}

// Nodes returns the nodes, in the same order as Addrs. The slice is a copy;
// the Servers are the cluster's own.
func (c *Cluster) Nodes() []*Server {
	return append([]*Server(nil), c.nodes...)
}

// WaitOK waits, at most 30s, until every node reports cluster_state:ok
// with all 16384 slots assigned, and lists every node of the cluster, itself
// included, with no fail or handshake flag and a connected link. It fails
// the test with the last node's view if that does not happen in time. Call it
// after restarting a node; every node must be running.
func (c *Cluster) WaitOK(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(clusterReadyTimeout)
	for {
		err := c.healthy()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redistest: cluster %v not healthy after %v: %v", c.Addrs(), clusterReadyTimeout, err)
		}
		time.Sleep(pollInterval) // poll CLUSTER INFO until the deadline
	}
}

// healthy returns nil if every node sees a healthy cluster, or an error that
// describes the first node that does not.
func (c *Cluster) healthy() error {
	for _, n := range c.nodes {
		info, err := n.Command("CLUSTER", "INFO")
		if err != nil {
			return fmt.Errorf("%s: CLUSTER INFO: %w", n.Addr(), err)
		}
		if got := infoField(info, "cluster_state"); got != "ok" {
			return fmt.Errorf("%s: cluster_state:%s, want ok", n.Addr(), got)
		}
		if got, want := infoField(info, "cluster_slots_assigned"), strconv.Itoa(clusterSlots); got != want {
			return fmt.Errorf("%s: cluster_slots_assigned:%s, want %s", n.Addr(), got, want)
		}
		repl, err := n.Command("INFO", "replication")
		if err != nil {
			return fmt.Errorf("%s: INFO replication: %w", n.Addr(), err)
		}
		if infoField(repl, "role") == "slave" && infoField(repl, "master_link_status") != "up" {
			return fmt.Errorf("%s: replica with master_link_status:%s, want up", n.Addr(), infoField(repl, "master_link_status"))
		}
		nodes, err := n.Command("CLUSTER", "NODES")
		if err != nil {
			return fmt.Errorf("%s: CLUSTER NODES: %w", n.Addr(), err)
		}
		if err := c.checkNodes(nodes); err != nil {
			return fmt.Errorf("%s: %w", n.Addr(), err)
		}
	}
	return nil
}

// checkNodes checks one node's CLUSTER NODES reply: exactly the cluster's
// nodes, each healthy and connected. A line reads
// "<id> <ip:port@cport[,hostname]> <flags> <master> <ping-sent> <pong-recv>
// <config-epoch> <link-state> <slot>...".
func (c *Cluster) checkNodes(reply string) error {
	want := make(map[string]bool, len(c.nodes))
	for _, addr := range c.Addrs() {
		want[addr] = true
	}
	seen := 0
	for line := range strings.Lines(reply) {
		fields := strings.Fields(line)
		if len(fields) < 8 {
			continue
		}
		addr, _, _ := strings.Cut(fields[1], "@")
		if !want[addr] {
			return fmt.Errorf("knows node %s (%s), which is not one of %v", fields[1], fields[2], c.Addrs())
		}
		for flag := range strings.SplitSeq(fields[2], ",") {
			switch flag {
			case "fail", "fail?", "handshake", "noaddr":
				return fmt.Errorf("sees node %s as %s", addr, fields[2])
			}
		}
		if fields[7] != "connected" {
			return fmt.Errorf("link to node %s is %s", addr, fields[7])
		}
		seen++
	}
	if seen != len(c.nodes) {
		return fmt.Errorf("knows %d nodes, want %d", seen, len(c.nodes))
	}
	return nil
}
