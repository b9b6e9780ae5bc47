package main

import (
	"bytes"
	"errors"
	"net"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/storaged/storaged/server/peer"
	"github.com/storaged/storaged/storage"
	"github.com/storaged/storaged/storage/raftlog"
)

const peers3 = "1=127.0.0.1:9191,2=127.0.0.1:9192,3=127.0.0.1:9193"

// TestReplicationFlags: the group flags and their environment twins parse
// into replicationConfig; a group defaults to --flush-mode sync.
func TestReplicationFlags(t *testing.T) {
	cfg, err := parseConfig([]string{"--raft-id", "2", "--raft-peers", peers3, "--replication-timeout", "3s",
		"--peer-listen", "127.0.0.1:0"}, env(), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	r := cfg.Replication
	want := raftPeers{{1, "127.0.0.1:9191"}, {2, "127.0.0.1:9192"}, {3, "127.0.0.1:9193"}}
	if r.RaftID != 2 || !reflect.DeepEqual(r.RaftPeers, want) || r.ReplicationTimeout != 3*time.Second ||
		r.peerListen() != "127.0.0.1:0" || !r.group() {
		t.Fatalf("replication config %+v", r)
	}
	if cfg.FlushMode != storage.FlushSync {
		t.Fatalf("a group's flush mode is %v, want sync", cfg.FlushMode)
	}
	if got := r.RaftPeers.String(); got != peers3 {
		t.Fatalf("String() = %q", got)
	}
	if r.ForwardPuts || r.FollowerReads {
		t.Fatal("puts forwarded or follower reads on by default")
	}

	e := env("STORAGED_RAFT_ID", "3", "STORAGED_RAFT_PEERS", peers3, "STORAGED_FLUSH_MODE", "sync",
		"STORAGED_PEER_TLS_CERT", "c.pem", "STORAGED_PEER_TLS_KEY", "k.pem", "STORAGED_PEER_TLS_CA", "ca.pem",
		"STORAGED_REPLICATION_TIMEOUT", "7s", "STORAGED_RAFT_FORWARD_PUTS", "true", "STORAGED_RAFT_FOLLOWER_READS", "true")
	cfg, err = parseConfig(nil, e, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	r = cfg.Replication
	if r.RaftID != 3 || len(r.RaftPeers) != 3 || r.PeerTLSCert != "c.pem" || r.PeerTLSKey != "k.pem" || r.PeerTLSCA != "ca.pem" ||
		r.ReplicationTimeout != 7*time.Second || r.peerListen() != "127.0.0.1:9193" || !r.ForwardPuts || !r.FollowerReads {
		t.Fatalf("from the environment: %+v", r)
	}

	// Learners: the same list on every member; a learner may say so.
	peers4 := peers3 + ",4=127.0.0.1:9194"
	for _, args := range [][]string{
		{"--raft-id", "4", "--raft-peers", peers4, "--raft-learners", "4"},
		{"--raft-id", "4", "--raft-peers", peers4, "--raft-learners", "4", "--raft-learner"},
		{"--raft-id", "1", "--raft-peers", peers4, "--raft-learners", "4"},
	} {
		cfg, err := parseConfig(args, env(), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		g := cfg.Replication.groupOptions(nil)
		if !reflect.DeepEqual(g.Peers, []uint64{1, 2, 3}) || !reflect.DeepEqual(g.Learners, []uint64{4}) {
			t.Fatalf("%v: voters %v, learners %v", args, g.Peers, g.Learners)
		}
	}
	cfg, err = parseConfig([]string{"--raft-id", "1", "--raft-peers", peers4, "--raft-learners", "4"}, env(), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	cfg3, err := parseConfig([]string{"--raft-id", "1", "--raft-peers", peers3}, env(), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	all4, err := parseConfig([]string{"--raft-id", "1", "--raft-peers", peers4}, env(), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	// The learners are part of the membership digest; a group without
	// them keeps the digest of before.
	// (94067b9f… is the digest data dirs of groups 1,2,3 recorded before.)
	if id := cfg.Replication.clusterID(); id == all4.Replication.clusterID() || id == cfg3.Replication.clusterID() ||
		cfg3.Replication.clusterID() != "94067b9f5089fa4a79da33d5aa4fd6f2" {
		t.Fatalf("cluster ids: with learner %s, 4 voters %s, 3 voters %s", id, all4.Replication.clusterID(), cfg3.Replication.clusterID())
	}

	// Timing and the group's name: the flags and their environment twins.
	for _, tc := range []struct {
		args, env []string
		tick      time.Duration
		ticks     int
		name      string
	}{
		{[]string{"--raft-id", "1", "--raft-peers", peers3}, nil, 100 * time.Millisecond, 10, "default"},
		{[]string{"--raft-id", "1", "--raft-peers", peers3, "--raft-tick", "50ms", "--raft-election-timeout", "750ms", "--raft-group", "orders-eu.1"},
			nil, 50 * time.Millisecond, 15, "orders-eu.1"},
		{[]string{"--raft-id", "1", "--raft-peers", peers3}, []string{"STORAGED_RAFT_TICK", "20ms", "STORAGED_RAFT_ELECTION_TIMEOUT", "40ms",
			"STORAGED_RAFT_GROUP", "g2"}, 20 * time.Millisecond, 2, "g2"},
		{[]string{"--raft-id", "1", "--raft-peers", peers3, "--raft-tick", "1ms", "--raft-election-timeout", "1s"}, nil, time.Millisecond, 1000, "default"},
	} {
		cfg, err := parseConfig(tc.args, env(tc.env...), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%v %v: %v", tc.args, tc.env, err)
		}
		g := cfg.Replication.groupOptions(nil)
		if g.TickInterval != tc.tick || g.ElectionTick != tc.ticks || g.HeartbeatTick != 1 || g.Name != tc.name {
			t.Fatalf("%v %v: tick %v, election %d ticks, heartbeat %d, group %q; want %v, %d, 1, %q",
				tc.args, tc.env, g.TickInterval, g.ElectionTick, g.HeartbeatTick, g.Name, tc.tick, tc.ticks, tc.name)
		}
		o := storage.Options{Dir: t.TempDir(), FlushMode: storage.FlushSync, Group: g}
		g.Transport = nopTransport{}
		if err := o.Validate(); err != nil {
			t.Fatalf("%v %v: the store refuses the group options: %v", tc.args, tc.env, err)
		}
	}
	// The catch-up readahead: off unless given a size; each accepted by
	// the store.
	for _, tc := range []struct {
		args, env []string
		want      int64
	}{
		{[]string{"--raft-id", "1", "--raft-peers", peers3}, nil, 0},
		{[]string{"--raft-id", "1", "--raft-peers", peers3, "--raft-catchup-readahead", "32MiB"}, nil, 32 << 20},
		{[]string{"--raft-id", "1", "--raft-peers", peers3, "--raft-catchup-readahead", "0"}, nil, 0},
		{[]string{"--raft-id", "1", "--raft-peers", peers3}, []string{"STORAGED_RAFT_CATCHUP_READAHEAD", "1GiB"}, 1 << 30},
	} {
		cfg, err := parseConfig(tc.args, env(tc.env...), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%v %v: %v", tc.args, tc.env, err)
		}
		g := cfg.Replication.groupOptions(nopTransport{})
		if g.CatchUpReadahead != tc.want {
			t.Fatalf("%v %v: CatchUpReadahead %d, want %d", tc.args, tc.env, g.CatchUpReadahead, tc.want)
		}
		if err := (storage.Options{Dir: t.TempDir(), FlushMode: storage.FlushSync, Group: g}).Validate(); err != nil {
			t.Fatalf("%v %v: the store refuses the group options: %v", tc.args, tc.env, err)
		}
	}

	// The name is part of the cluster id; "default" keeps the old digest.
	named, err := parseConfig([]string{"--raft-id", "1", "--raft-peers", peers3, "--raft-group", "g1"}, env(), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	explicit, err := parseConfig([]string{"--raft-id", "1", "--raft-peers", peers3, "--raft-group", "default"}, env(), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if id := named.Replication.clusterID(); id == cfg3.Replication.clusterID() || explicit.Replication.clusterID() != cfg3.Replication.clusterID() {
		t.Fatalf("cluster ids: named g1 %s, default %s, explicit default %s", id, cfg3.Replication.clusterID(), explicit.Replication.clusterID())
	}

	// Standalone: nothing changes.
	cfg, err = parseConfig(nil, env(), &bytes.Buffer{})
	if err != nil || cfg.Replication.group() || cfg.FlushMode != storage.FlushAsync {
		t.Fatalf("standalone: %+v, %v", cfg.Replication, err)
	}
}

// nopTransport drops every message (options validation only).
type nopTransport struct{}

func (nopTransport) Send(uint64, []byte) {}

// TestReplicationFlagErrors: every mistake is refused at start with a
// message naming it.
func TestReplicationFlagErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		want string
	}{
		{"peers without id", []string{"--raft-peers", peers3}, nil, "--raft-peers needs --raft-id"},
		{"id not listed", []string{"--raft-id", "4", "--raft-peers", peers3}, nil, "--raft-id 4 is not in --raft-peers (ids [1 2 3])"},
		{"id zero", []string{"--raft-id", "0", "--raft-peers", peers3}, nil, `raft id "0": want a positive integer`},
		{"id not a number", []string{"--raft-id", "two"}, nil, `raft id "two"`},
		{"duplicate id", []string{"--raft-id", "1", "--raft-peers", "1=127.0.0.1:1,1=127.0.0.1:2"}, nil, "member id 1 listed twice"},
		{"duplicate address", []string{"--raft-id", "1", "--raft-peers", "1=127.0.0.1:1,2=127.0.0.1:1"}, nil,
			"address 127.0.0.1:1 listed for members 1 and 2"},
		{"no port", []string{"--raft-id", "1", "--raft-peers", "1=127.0.0.1,2=127.0.0.1:2"}, nil, `member "1=127.0.0.1"`},
		{"bad port", []string{"--raft-id", "1", "--raft-peers", "1=127.0.0.1:99999,2=127.0.0.1:2"}, nil, `port "99999"`},
		{"port zero", []string{"--raft-id", "1", "--raft-peers", "1=127.0.0.1:0,2=127.0.0.1:2"}, nil, `port "0"`},
		{"no host", []string{"--raft-id", "1", "--raft-peers", "1=:9191,2=127.0.0.1:2"}, nil, "has no host"},
		{"no equals", []string{"--raft-id", "1", "--raft-peers", "127.0.0.1:1"}, nil, "want id=host:port"},
		{"one member", []string{"--raft-id", "1", "--raft-peers", "1=127.0.0.1:1"}, nil, "a group needs at least 2"},
		{"async with peers", []string{"--raft-id", "1", "--raft-peers", peers3, "--flush-mode", "async"}, nil,
			"--flush-mode async is refused with --raft-peers"},
		{"async from env", []string{"--raft-id", "1", "--raft-peers", peers3}, []string{"STORAGED_FLUSH_MODE", "async"},
			"--flush-mode async is refused"},
		{"role master with peers", []string{"--raft-id", "1", "--raft-peers", peers3, "--role", "master"}, nil,
			"--role is for standalone master/slave"},
		{"role slave with peers", []string{"--raft-id", "1", "--raft-peers", peers3, "--role", "slave"}, nil, "--role is for standalone"},
		{"not loopback without tls", []string{"--raft-id", "1", "--raft-peers", "1=127.0.0.1:1,2=10.0.0.2:9191"}, nil,
			"member 2 at 10.0.0.2:9191 is not loopback: set --peer-tls-cert"},
		{"peer listen on all interfaces without tls", []string{"--raft-id", "1", "--raft-peers", peers3, "--peer-listen", ":9191"}, nil,
			"--peer-listen :9191 is not loopback"},
		{"peer listen bad", []string{"--raft-id", "1", "--raft-peers", peers3, "--peer-listen", "nope"}, nil, "--peer-listen: address"},
		{"half tls", []string{"--raft-id", "1", "--raft-peers", peers3, "--peer-tls-cert", "c.pem"}, nil,
			"--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together"},
		{"timeout", []string{"--raft-id", "1", "--raft-peers", peers3, "--replication-timeout", "0s"}, nil,
			"--replication-timeout 0s must be positive"},
		{"readahead too big", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-catchup-readahead", "2GiB"}, nil,
			"--raft-catchup-readahead 2GiB must be between 0 (off) and 1GiB"},
		{"readahead negative", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-catchup-readahead", "-1"}, nil,
			`flag -raft-catchup-readahead: size "-1"`},
		{"learner not listed", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-learner"}, nil,
			"--raft-learner: add this member's id 1 to --raft-learners"},
		{"learners not members", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-learners", "3,4"}, nil,
			"--raft-learners 4 is not in --raft-peers (ids [1 2 3])"},
		{"learners only", []string{"--raft-id", "1", "--raft-peers", "1=127.0.0.1:1,2=127.0.0.1:2", "--raft-learners", "1,2"}, nil,
			"a group needs at least one voter"},
		{"learners twice", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-learners", "3,3"}, nil, "id 3 listed twice"},
		{"learners bad id", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-learners", "x"}, nil, `raft id "x"`},
		{"id without peers", []string{"--raft-id", "1"}, nil, "--raft-id need --raft-peers"},
		{"learner, listen and tls without peers", []string{"--raft-learner", "--peer-listen", "127.0.0.1:1", "--peer-tls-ca", "ca.pem"}, nil,
			"--peer-listen, --raft-learner, --peer-tls-* need --raft-peers"},
		{"learners without peers", []string{"--raft-learners", "4"}, nil, "--raft-learners need --raft-peers"},
		{"forwarding without peers", []string{"--raft-forward-puts"}, nil, "--raft-forward-puts need --raft-peers"},
		{"follower reads without peers", []string{"--raft-follower-reads"}, nil, "--raft-follower-reads need --raft-peers"},
		{"timing without peers", []string{"--raft-tick", "50ms", "--raft-election-timeout", "1s", "--raft-group", "g1"}, nil,
			"--raft-tick, --raft-election-timeout, --raft-group need --raft-peers"},
		{"election not whole ticks", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-tick", "30ms"}, nil,
			"--raft-election-timeout 1s is not a whole number of --raft-tick 30ms"},
		{"election one tick", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-election-timeout", "100ms"}, nil,
			"--raft-election-timeout 100ms is 1 ticks of --raft-tick 100ms: want 2 to 1000"},
		{"election zero", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-election-timeout", "0s"}, nil,
			"is 0 ticks"},
		{"election too many ticks", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-tick", "1ms", "--raft-election-timeout", "2s"}, nil,
			"is 2000 ticks"},
		{"tick zero", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-tick", "0s"}, nil, "--raft-tick 0s: want 1ms to 10s"},
		{"tick long", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-tick", "11s"}, nil, "--raft-tick 11s: want 1ms to 10s"},
		{"tick from env", []string{"--raft-id", "1", "--raft-peers", peers3}, []string{"STORAGED_RAFT_TICK", "300ms"},
			"not a whole number of --raft-tick 300ms"},
		{"group name", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-group", "g/1"}, nil,
			`--raft-group "g/1": want letters, digits`},
		{"group name empty", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-group", ""}, nil,
			`--raft-group "": want 1 to 64 characters`},
		{"join without peers", []string{"--raft-join", strings.Repeat("a", 32)}, nil, "--raft-join need --raft-peers"},
		{"join not a cluster id", []string{"--raft-id", "4", "--raft-peers", peers3 + ",4=127.0.0.1:9194", "--raft-join", "abc"}, nil,
			`--raft-join "abc": want the group's cluster id, 32 hex digits`},
		{"join upper case", []string{"--raft-id", "4", "--raft-peers", peers3 + ",4=127.0.0.1:9194", "--raft-join",
			strings.Repeat("A", 32)}, nil, "32 lower-case hex digits"},
		{"join with learners", []string{"--raft-id", "4", "--raft-peers", peers3 + ",4=127.0.0.1:9194", "--raft-join",
			strings.Repeat("a", 32), "--raft-learners", "4"}, nil, "--raft-join takes no --raft-learners"},
		{"join not listing itself", []string{"--raft-id", "4", "--raft-peers", peers3, "--raft-join", strings.Repeat("a", 32)}, nil,
			"--raft-id 4 is not in --raft-peers"},
		{"group name long", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-group", strings.Repeat("g", 65)}, nil,
			"want 1 to 64 characters"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			_, err := parseConfig(tc.args, env(tc.env...), &stderr)
			var uerr usageError
			if !errors.As(err, &uerr) {
				t.Fatalf("err %v, want a usage error", err)
			}
			if !strings.Contains(err.Error(), tc.want) && !strings.Contains(stderr.String(), tc.want) {
				t.Fatalf("err %q (stderr %q), want %q", err, stderr.String(), tc.want)
			}
		})
	}
	// TLS lifts the loopback rule.
	if _, err := parseConfig([]string{"--raft-id", "1", "--raft-peers", "1=host1:9191,2=host2:9191,3=host3:9191", "--peer-listen", ":9191",
		"--peer-tls-cert", "c.pem", "--peer-tls-key", "k.pem", "--peer-tls-ca", "ca.pem"}, env(), &bytes.Buffer{}); err != nil {
		t.Fatalf("with peer TLS: %v", err)
	}
}

// startMember1Transport parses the flags of member 1 of a group of three
// whose own peer address is a free loopback port (own), and starts its
// peer transport there (client address 127.0.0.1:9090).
func startMember1Transport(t *testing.T) (config, string, *peer.Transport) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	own := lis.Addr().String()
	lis.Close()
	cfg, err := parseConfig([]string{"--raft-id", "1", "--raft-peers", "1=" + own + ",2=127.0.0.1:1,3=127.0.0.1:2"}, env(), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	l := zerolog.Nop()
	tr, err := cfg.Replication.startTransport("127.0.0.1:9090", &l)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, own, tr
}

// startTransport listens on this member's peer address and closes
// cleanly; a bad TLS file is refused before anything listens.
func TestStartTransport(t *testing.T) {
	cfg, own, tr := startMember1Transport(t)
	l := zerolog.Nop()
	if got := tr.Addr().String(); got != own {
		t.Errorf("peer listener on %s, want %s", got, own)
	}
	if got := tr.ClientAddr(1); got != "127.0.0.1:9090" {
		t.Errorf("own client address %q", got)
	}
	if err := tr.Close(); err != nil {
		t.Fatal(err)
	}
	r := cfg.Replication
	r.PeerTLSCert, r.PeerTLSKey, r.PeerTLSCA = "missing.pem", "missing.pem", "missing.pem"
	if _, err := r.startTransport("127.0.0.1:9090", &l); err == nil || !strings.Contains(err.Error(), "peer: load TLS key pair") {
		t.Fatalf("missing TLS files: %v", err)
	}
}

// FuzzRaftPeers: parsing --raft-peers never panics, and what it accepts
// prints back to a list that parses to the same members.
func FuzzRaftPeers(f *testing.F) {
	for _, s := range []string{peers3, "1=host1:9191,2=host2:9191", "1=[::1]:1,2=localhost:2", "", "1=", "=:", "1=a:1,1=b:2",
		"18446744073709551615=h:65535", "1=h:0", " 1 = h:1 , 2=h:2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var p raftPeers
		if err := p.Set(s); err != nil {
			return
		}
		var q raftPeers
		if err := q.Set(p.String()); err != nil {
			t.Fatalf("%q parsed to %q, which does not parse: %v", s, p.String(), err)
		}
		if !reflect.DeepEqual(p, q) {
			t.Fatalf("%q: %v, then %v", s, p, q)
		}
		for _, m := range p {
			if m.id == 0 || checkHostPort(m.addr, false) != nil {
				t.Fatalf("%q: accepted member %v", s, m)
			}
		}
	})
}

// TestGroupPeerPortInUse: a member whose peer address is taken stops at
// start with an error naming --peer-listen, before it opens the store.
func TestGroupPeerPortInUse(t *testing.T) {
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	var stderr bytes.Buffer
	err = run(t.Context(), []string{"--raft-id", "1", "--raft-peers", "1=" + busy.Addr().String() + ",2=127.0.0.1:1,3=127.0.0.1:2",
		"--data-dir", t.TempDir(), "--listen", "127.0.0.1:0", "--metrics-listen", "", "--admin-listen", ""}, env(), &stderr)
	if err == nil || !strings.Contains(err.Error(), "--peer-listen") || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("run with a busy peer port: %v", err)
	}
}

// TestRaftIDOrdinal: --raft-id ordinal is a StatefulSet pod's ordinal + 1,
// from its host name; anything else is an id as before.
func TestRaftIDOrdinal(t *testing.T) {
	for _, c := range []struct {
		flag, host string
		want       uint64
		err        string
	}{
		{"ordinal", "storaged-0", 1, ""},
		{"ordinal", "my-store-12", 13, ""},
		{" ordinal ", "storaged-2", 3, ""},
		{"ordinal", "storaged", 0, `host name "storaged" does not end in -N`},
		{"ordinal", "storaged-x", 0, `does not end in -N`},
		{"ordinal", "storaged-", 0, `does not end in -N`},
		{"ordinal", "storaged-99999999999", 0, `does not end in -N`},
		{"4", "storaged-0", 4, ""},
		{"0", "storaged-0", 0, `want a positive integer`},
	} {
		got, err := parseRaftIDFlag(c.flag, func() (string, error) { return c.host, nil })
		if got != c.want || (err == nil) != (c.err == "") || (err != nil && !strings.Contains(err.Error(), c.err)) {
			t.Errorf("--raft-id %q on host %q: %d, %v; want %d, %q", c.flag, c.host, got, err, c.want, c.err)
		}
	}
	if _, err := parseRaftIDFlag("ordinal", func() (string, error) { return "", errors.New("no uts") }); err == nil ||
		!strings.Contains(err.Error(), "no uts") {
		t.Errorf("host name failure: %v", err)
	}
}

// TestGroupIdentityInDataDir: a member's data dir records its group's
// name and cluster id at its first start; a later start of the same dir
// with another --raft-group, or with the same name for a group of other
// members (another cluster id), is refused, and the same flags open it.
func TestGroupIdentityInDataDir(t *testing.T) {
	dir := t.TempDir()
	open := func(args ...string) error {
		t.Helper()
		cfg, err := parseConfig(append([]string{"--raft-id", "1"}, args...), env(), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		g := cfg.Replication.groupOptions(nopTransport{})
		st, err := storage.Open(storage.Options{Dir: dir, FlushMode: storage.FlushSync, FileSize: 1 << 20, Group: g})
		if err != nil {
			return err
		}
		return st.Close()
	}
	if err := open("--raft-peers", peers3, "--raft-group", "g1"); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	meta, err := storage.ReadReplicaMeta(storage.Options{Dir: dir})
	if err != nil || meta.Group != "g1" || meta.ClusterUUID == "" {
		t.Fatalf("raft/meta: %+v %v", meta, err)
	}
	for _, args := range [][]string{
		{"--raft-peers", peers3, "--raft-group", "g2"},
		{"--raft-peers", peers3},
		{"--raft-peers", peers3 + ",4=127.0.0.1:9194", "--raft-group", "g1"},
	} {
		if err := open(args...); !errors.Is(err, raftlog.ErrMetaMismatch) {
			t.Fatalf("%v: %v, want the data dir refused (ErrMetaMismatch)", args, err)
		}
	}
	if err := open("--raft-peers", peers3, "--raft-group", "g1"); err != nil {
		t.Fatalf("the same flags again: %v", err)
	}
}

// TestRaftJoinFlags: --raft-join (or STORAGED_RAFT_JOIN) makes the store
// join with the given cluster id; --raft-peers lists this member and the
// members it reaches, all of them plain peers.
func TestRaftJoinFlags(t *testing.T) {
	const cid = "0123456789abcdef0123456789abcdef"
	peers := "4=127.0.0.1:9194,1=127.0.0.1:9191"
	for _, c := range []struct {
		args, env []string
	}{
		{[]string{"--raft-id", "4", "--raft-peers", peers, "--raft-join", cid, "--raft-group", "g1"}, nil},
		{[]string{"--raft-id", "4", "--raft-peers", peers}, []string{"STORAGED_RAFT_JOIN", cid, "STORAGED_RAFT_GROUP", "g1"}},
	} {
		cfg, err := parseConfig(c.args, env(c.env...), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%v %v: %v", c.args, c.env, err)
		}
		g := cfg.Replication.groupOptions(nopTransport{})
		if !g.Join || g.ClusterID != cid || g.Name != "g1" || g.ID != 4 || cfg.Replication.groupClusterID() != cid {
			t.Fatalf("%v %v: group options %+v", c.args, c.env, g)
		}
		o := storage.Options{Dir: t.TempDir(), FlushMode: storage.FlushSync, Group: g}
		if err := o.Validate(); err != nil {
			t.Fatalf("the store refuses the joining options: %v", err)
		}
	}
	// Without --raft-join: the digest of the flags, no Join.
	cfg, err := parseConfig([]string{"--raft-id", "1", "--raft-peers", peers3}, env(), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if g := cfg.Replication.groupOptions(nopTransport{}); g.Join || g.ClusterID != cfg.Replication.clusterID() {
		t.Fatalf("bootstrap member: %+v", g)
	}
}

// waitReady polls until st's leader is ready, failing after 20 s.
func waitReady(t *testing.T, st *storage.Store) {
	t.Helper()
	poll, deadline := time.NewTicker(5*time.Millisecond), time.After(20*time.Second)
	defer poll.Stop()
	for !st.ReplicaInfo().Ready {
		select {
		case <-deadline:
			t.Fatal("the group's leader is not ready after 20s")
		case <-poll.C:
		}
	}
}

// TestClusterIDFromDataDir: a start on a data dir that has raft/meta uses
// the cluster id recorded there, not the digest of the current flags: once
// a membership change is recorded (raft/conf) the member list of the flags
// may differ from the bootstrap's and the store opens; before any change
// raftlog still refuses other members. A joined member's data dir keeps
// its --raft-join cluster id, and refuses another one.
func TestClusterIDFromDataDir(t *testing.T) {
	dir := t.TempDir()
	open := func(cfg *config) (*storage.Store, error) {
		t.Helper()
		if err := cfg.Replication.resolveCluster(dir); err != nil {
			return nil, err
		}
		g := cfg.Replication.groupOptions(nopTransport{})
		g.TickInterval = 10 * time.Millisecond
		return storage.Open(storage.Options{Dir: dir, FlushMode: storage.FlushSync, FileSize: 1 << 20, Group: g})
	}
	parse := func(args ...string) config {
		t.Helper()
		cfg, err := parseConfig(args, env(), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	boot := parse("--raft-id", "1", "--raft-peers", "1=127.0.0.1:9191,2=127.0.0.1:9192")
	// A one-voter bootstrap (the flags need two members: drop member 2
	// from the options so that this member leads alone).
	boot.Replication.RaftLearners = raftIDs{2}
	st, err := open(&boot)
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, st)
	cid := boot.Replication.groupClusterID()
	other := parse("--raft-id", "1", "--raft-peers", "1=127.0.0.1:9191,3=127.0.0.1:9193")
	if other.Replication.clusterID() == cid {
		t.Fatal("the test needs flags with another digest")
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// No change recorded: other members are refused, with the recorded
	// cluster id (not a cluster mismatch: the member list).
	if _, err := open(&other); !errors.Is(err, raftlog.ErrMetaMismatch) || !strings.Contains(err.Error(), "bootstrap members") {
		t.Fatalf("other members before a change: %v", err)
	}
	// Record a change: add learner 3.
	st, err = open(&boot)
	if err != nil {
		t.Fatal(err)
	}
	waitReady(t, st)
	if _, err := st.AddLearner(t.Context(), 3, "127.0.0.1:9193"); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	other = parse("--raft-id", "1", "--raft-peers", "1=127.0.0.1:9191,3=127.0.0.1:9193")
	st, err = open(&other)
	if err != nil {
		t.Fatalf("other members after a change: %v", err)
	}
	if got := other.Replication.groupClusterID(); got != cid {
		t.Errorf("cluster id %s, want the recorded %s", got, cid)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	// --raft-join of another cluster on this dir is refused.
	join := parse("--raft-id", "1", "--raft-peers", "1=127.0.0.1:9191,3=127.0.0.1:9193", "--raft-join", strings.Repeat("a", 32))
	if _, err := open(&join); err == nil || !strings.Contains(err.Error(), "belongs to cluster "+cid) {
		t.Fatalf("--raft-join of another cluster: %v", err)
	}

	// A joined member (member 3's own data dir, started with --raft-join)
	// restarted without the flag before it learned any membership (its
	// leader never reached it) still opens as a joining member: its
	// raft/meta records no bootstrap members to check the flags against.
	dir = t.TempDir()
	joiner := parse("--raft-id", "3", "--raft-peers", "1=127.0.0.1:9191,3=127.0.0.1:9193", "--raft-join", cid)
	st, err = open(&joiner)
	if err != nil {
		t.Fatalf("a joining member's first start: %v", err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	again := parse("--raft-id", "3", "--raft-peers", "1=127.0.0.1:9191,3=127.0.0.1:9193")
	st, err = open(&again)
	if err != nil {
		t.Fatalf("a joined member restarted without --raft-join: %v", err)
	}
	if got := again.Replication.groupClusterID(); got != cid || !again.Replication.joined {
		t.Errorf("restarted joiner: cluster id %s (want %s), joined %v", got, cid, again.Replication.joined)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestMemberSync: membership updates reach the peer transport: a member a
// conf change added gets a link at the address the change recorded, one
// the flags list keeps its flags address, a removed member's link goes,
// an update older than one applied changes nothing, and this member's own
// address is its flags' (a joiner's flags may not list it: the address
// its addition recorded).
func TestMemberSync(t *testing.T) {
	cfg, own, tr := startMember1Transport(t)
	defer tr.Close()
	l := zerolog.Nop()
	ms := &memberSync{tr: tr, self: 1, flags: cfg.Replication.RaftPeers.peerMap(), log: &l}
	want := func(peers map[uint64]string) {
		t.Helper()
		if got := tr.Peers(); !reflect.DeepEqual(got, peers) {
			t.Fatalf("transport peers %v, want %v", got, peers)
		}
	}
	ms.apply(storage.MembershipUpdate{Membership: storage.GroupMembership{Index: 5, Voters: []uint64{1, 2, 3}, Learners: []uint64{4}},
		PeerAddrs: map[uint64]string{4: "127.0.0.1:3", 2: "127.0.0.1:9"}})
	want(map[uint64]string{2: "127.0.0.1:1", 3: "127.0.0.1:2", 4: "127.0.0.1:3"})
	removed := storage.MembershipUpdate{Membership: storage.GroupMembership{Index: 9, Voters: []uint64{1, 2, 4}},
		PeerAddrs: map[uint64]string{4: "127.0.0.1:3", 3: "127.0.0.1:2"}, Removed: []uint64{3}}
	ms.apply(removed)
	want(map[uint64]string{2: "127.0.0.1:1", 4: "127.0.0.1:3"})
	ms.apply(storage.MembershipUpdate{Membership: storage.GroupMembership{Index: 5, Voters: []uint64{1, 2, 3}}}) // stale
	want(map[uint64]string{2: "127.0.0.1:1", 4: "127.0.0.1:3"})
	ms.apply(removed) // the same again: nothing moves
	want(map[uint64]string{2: "127.0.0.1:1", 4: "127.0.0.1:3"})
	if got := tr.PeerAddr(); got != own {
		t.Fatalf("own peer address %q, want the flags' %q", got, own)
	}
	ms.apply(storage.MembershipUpdate{Membership: storage.GroupMembership{Index: 12, Voters: []uint64{1, 2, 4}},
		PeerAddrs: map[uint64]string{1: "127.0.0.1:5", 4: "127.0.0.1:3"}})
	if got := tr.PeerAddr(); got != own {
		t.Fatalf("own peer address %q after a change recorded another: want the flags' %q", got, own)
	}
	delete(ms.flags, 1) // a joiner started with only --peer-listen
	ms.apply(storage.MembershipUpdate{Membership: storage.GroupMembership{Index: 13, Voters: []uint64{1, 2, 4}},
		PeerAddrs: map[uint64]string{1: "127.0.0.1:5", 4: "127.0.0.1:3"}})
	if got := tr.PeerAddr(); got != "127.0.0.1:5" {
		t.Fatalf("own peer address %q, want the one the addition recorded", got)
	}
}

// withHostname makes --raft-id ordinal read name as the host name for
// the rest of the test.
func withHostname(t *testing.T, name string) {
	t.Helper()
	old := hostname
	hostname = func() (string, error) { return name, nil }
	t.Cleanup(func() { hostname = old })
}

// chartPeers is STORAGED_RAFT_PEERS as the Helm chart renders it for
// release storaged in namespace store with replication.bootstrapReplicas=3
// (deploy/helm/chart_test.go checks the rendering; this test what the
// binary makes of it).
const chartPeers = "1=storaged-0.storaged-headless.store.svc:9093,2=storaged-1.storaged-headless.store.svc:9093," +
	"3=storaged-2.storaged-headless.store.svc:9093"

// chartPodEnv is a chart pod's replication environment: join is the
// ConfigMap's join-cluster-id, ordinalIDs its ordinal-ids (both "" until
// set).
func chartPodEnv(join, ordinalIDs string) []string {
	return []string{"STORAGED_RAFT_ID", "ordinal", "STORAGED_RAFT_PEERS", chartPeers, "STORAGED_PEER_LISTEN", ":9093",
		"STORAGED_PEER_TLS_CERT", "/etc/storaged/peer-tls/tls.crt", "STORAGED_PEER_TLS_KEY", "/etc/storaged/peer-tls/tls.key",
		"STORAGED_PEER_TLS_CA", "/etc/storaged/peer-tls/ca.crt", "STORAGED_RAFT_FORWARD_PUTS", "true", "STORAGED_RAFT_FOLLOWER_READS", "true",
		"STORAGED_RAFT_JOIN_UNLISTED", join, "STORAGED_RAFT_ORDINAL_IDS", ordinalIDs}
}

// TestChartPodIdentity: one pod template (the chart's environment) makes
// the pods of the bootstrap membership its members 1..3, exactly as
// without --raft-join-unlisted (the digest of the same members, no join),
// and every other pod a joining member: pods beyond the bootstrap ones
// as ordinal + 1, a pod that --raft-ordinal-ids names under its new id.
func TestChartPodIdentity(t *testing.T) {
	const cid = "94067b9f5089fa4a79da33d5aa4fd6f2" // the digest of members 1,2,3 (TestReplicationFlags)
	for _, tc := range []struct {
		host, join, ordinalIDs string
		id                     uint64
		joins                  bool
	}{
		{"storaged-0", "", "", 1, false},
		{"storaged-2", "", "", 3, false},
		{"storaged-0", cid, "", 1, false},
		{"storaged-2", cid, "", 3, false},
		{"storaged-3", cid, "", 4, true},
		{"storaged-4", cid, "", 5, true},
		{"storaged-1", cid, "1=101", 101, true},
		{"storaged-0", cid, "1=101", 1, false},
		{"storaged-2", cid, "1=101,3=102", 3, false},
		{"storaged-3", cid, "1=101,3=102", 102, true},
		{"storaged-5", cid, "1=101", 6, true},
	} {
		name := tc.host + "/" + tc.join + "/" + tc.ordinalIDs
		t.Run(name, func(t *testing.T) {
			withHostname(t, tc.host)
			cfg, err := parseConfig(nil, env(chartPodEnv(tc.join, tc.ordinalIDs)...), &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			r := &cfg.Replication
			g := r.groupOptions(nopTransport{})
			if g.ID != tc.id || g.Join != tc.joins {
				t.Fatalf("member %d joining %v, want %d joining %v", g.ID, g.Join, tc.id, tc.joins)
			}
			if tc.joins {
				if g.ClusterID != cid || r.join() != cid {
					t.Fatalf("joins cluster %q (join %q), want %s", g.ClusterID, r.join(), cid)
				}
			} else {
				// What the pod was before the flags existed: --raft-id N and the same peers.
				legacy, err := parseConfig([]string{"--raft-id", strconv.FormatUint(tc.id, 10), "--raft-peers", chartPeers,
					"--peer-listen", ":9093", "--peer-tls-cert", "c", "--peer-tls-key", "k", "--peer-tls-ca", "a"}, env(), &bytes.Buffer{})
				if err != nil {
					t.Fatal(err)
				}
				lg := legacy.Replication.groupOptions(nopTransport{})
				if g.ClusterID != lg.ClusterID || g.ClusterID != cid || !reflect.DeepEqual(g.Peers, lg.Peers) || g.Join {
					t.Fatalf("bootstrap member: cluster %s peers %v join %v; before the flags: %s %v", g.ClusterID, g.Peers,
						g.Join, lg.ClusterID, lg.Peers)
				}
			}
			if err := (storage.Options{Dir: t.TempDir(), FlushMode: storage.FlushSync, Group: g}).Validate(); err != nil {
				t.Fatalf("the store refuses the options: %v", err)
			}
		})
	}
}

// TestChartPodIdentityErrors: a pod the chart's environment cannot make a
// member of refuses to start, saying why; so do the new flags' misuses.
func TestChartPodIdentityErrors(t *testing.T) {
	const cid = "94067b9f5089fa4a79da33d5aa4fd6f2"
	for _, tc := range []struct {
		name, host string
		args, env  []string
		want       string
	}{
		{"pod beyond the bootstrap without a cluster id", "storaged-3", nil, chartPodEnv("", ""),
			"--raft-id 4 is not in --raft-peers (ids [1 2 3]); only a member that joins"},
		{"replaced pod without a cluster id", "storaged-1", nil, chartPodEnv("", "1=101"),
			"--raft-id 101 is not in --raft-peers (ids [1 2 3]) (pod ordinal 1, by --raft-ordinal-ids)"},
		{"replaced pod under a bootstrap id", "storaged-1", nil, chartPodEnv(cid, "1=3"),
			"makes this pod member 3 (pod ordinal 1, by --raft-ordinal-ids), which --raft-peers lists as a bootstrap member"},
		{"cluster id malformed", "storaged-0", nil, chartPodEnv("abc", ""), `--raft-join-unlisted "abc": want the group's cluster id`},
		{"ordinal ids twice an ordinal", "storaged-0", nil, chartPodEnv(cid, "1=101,1=102"), "pod ordinal 1 listed twice"},
		{"ordinal ids twice an id", "storaged-0", nil, chartPodEnv(cid, "1=101,2=101"), "member id 101 given to pods 1 and 2"},
		{"ordinal ids no equals", "storaged-0", nil, chartPodEnv(cid, "101"), `"101": want ordinal=id`},
		{"ordinal ids bad ordinal", "storaged-0", nil, chartPodEnv(cid, "x=101"), `ordinal "x": want a pod ordinal`},
		{"ordinal ids id zero", "storaged-0", nil, chartPodEnv(cid, "1=0"), `raft id "0": want a positive integer`},
		{"ordinal ids without ordinal", "storaged-0", []string{"--raft-id", "1", "--raft-peers", peers3, "--raft-ordinal-ids", "1=101"}, nil,
			"--raft-ordinal-ids needs --raft-id ordinal"},
		{"unlisted joiner without peer listen", "h", []string{"--raft-id", "4", "--raft-peers", peers3, "--raft-join-unlisted", cid}, nil,
			"--raft-id 4 is not in --raft-peers (ids [1 2 3]): a joining member it does not list needs --peer-listen"},
		{"both joins", "h", []string{"--raft-id", "4", "--raft-peers", peers3 + ",4=127.0.0.1:9194", "--raft-join", cid,
			"--raft-join-unlisted", cid}, nil, "--raft-join and --raft-join-unlisted: give one"},
		{"unlisted joiner with learners", "h", []string{"--raft-id", "4", "--raft-peers", peers3, "--peer-listen", "127.0.0.1:9194",
			"--raft-join-unlisted", cid, "--raft-learners", "3"}, nil, "--raft-join takes no --raft-learners"},
		{"standalone", "h", []string{"--raft-join-unlisted", cid, "--raft-ordinal-ids", "1=101"}, nil,
			"--raft-join-unlisted, --raft-ordinal-ids need --raft-peers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			withHostname(t, tc.host)
			var stderr bytes.Buffer
			_, err := parseConfig(tc.args, env(tc.env...), &stderr)
			var uerr usageError
			if !errors.As(err, &uerr) {
				t.Fatalf("err %v, want a usage error", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %q, want %q", err, tc.want)
			}
		})
	}
	// Loopback, with --peer-listen: an unlisted member joins with either flag.
	for _, flagName := range []string{"--raft-join", "--raft-join-unlisted"} {
		cfg, err := parseConfig([]string{"--raft-id", "4", "--raft-peers", peers3, "--peer-listen", "127.0.0.1:9194", flagName, cid},
			env(), &bytes.Buffer{})
		if err != nil {
			t.Fatalf("%s: %v", flagName, err)
		}
		if g := cfg.Replication.groupOptions(nopTransport{}); !g.Join || g.ID != 4 || g.ClusterID != cid {
			t.Fatalf("%s: %+v", flagName, g)
		}
	}
}

// TestChartUpgradeKeepsMembers: the data dir of a bootstrap member opens
// under the chart's environment once the group grows (join-cluster-id and
// ordinal-ids set), before any membership change, where a
// STORAGED_RAFT_PEERS listing the grown membership is refused; a pod
// given a new id on its intact data dir is refused; a joining pod's data
// dir opens again under the same environment.
func TestChartUpgradeKeepsMembers(t *testing.T) {
	const cid = "94067b9f5089fa4a79da33d5aa4fd6f2"
	open := func(dir, host string, e []string) error {
		t.Helper()
		withHostname(t, host)
		cfg, err := parseConfig(nil, env(e...), &bytes.Buffer{})
		if err != nil {
			t.Fatal(err)
		}
		if err := cfg.Replication.resolveCluster(dir); err != nil {
			return err
		}
		st, err := storage.Open(storage.Options{Dir: dir, FlushMode: storage.FlushSync, FileSize: 1 << 20,
			Group: cfg.Replication.groupOptions(nopTransport{})})
		if err != nil {
			return err
		}
		return st.Close()
	}
	dir := t.TempDir()
	if err := open(dir, "storaged-0", chartPodEnv("", "")); err != nil {
		t.Fatalf("bootstrap: %v", err)
	}
	grown := chartPeers + ",4=storaged-3.storaged-headless.store.svc:9093,5=storaged-4.storaged-headless.store.svc:9093"
	before := append(chartPodEnv("", ""), "STORAGED_RAFT_PEERS", grown) // env() keeps the last value of a name
	if err := open(dir, "storaged-0", before); !errors.Is(err, raftlog.ErrMetaMismatch) {
		t.Fatalf("peers listing the grown membership: %v, want ErrMetaMismatch (why the chart keeps the bootstrap list)", err)
	}
	if err := open(dir, "storaged-0", chartPodEnv(cid, "1=101,3=102")); err != nil {
		t.Fatalf("bootstrap member after the upgrade: %v", err)
	}
	// A wrong ordinal in --raft-ordinal-ids: the pod's intact data dir refuses its new id.
	pod1 := t.TempDir()
	if err := open(pod1, "storaged-1", chartPodEnv("", "")); err != nil {
		t.Fatalf("bootstrap of pod 1: %v", err)
	}
	if err := open(pod1, "storaged-1", chartPodEnv(cid, "1=101")); !errors.Is(err, raftlog.ErrMetaMismatch) ||
		!strings.Contains(err.Error(), "the data dir belongs to node 2, not 101") {
		t.Fatalf("pod 1's member 2 data dir started as member 101: %v, want it refused", err)
	}
	joiner := t.TempDir()
	for range 2 {
		if err := open(joiner, "storaged-3", chartPodEnv(cid, "1=101,3=102")); err != nil {
			t.Fatalf("joining pod: %v", err)
		}
	}
	meta, err := storage.ReadReplicaMeta(storage.Options{Dir: joiner})
	if err != nil || meta.NodeID != 102 || meta.ClusterUUID != cid || len(meta.Voters) != 0 {
		t.Fatalf("joining pod's raft/meta %+v, %v: want node 102 of cluster %s, no bootstrap members", meta, err, cid)
	}
}
