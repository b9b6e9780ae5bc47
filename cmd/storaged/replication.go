package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
	"github.com/storaged/storaged/server"
	"github.com/storaged/storaged/server/peer"
	"github.com/storaged/storaged/storage"
)

// replicationConfig holds the flags of a replication group (design
// replication.md §1, §4). Without --raft-peers storaged runs standalone
// and every field stays zero.
type replicationConfig struct {
	RaftID             uint64
	RaftPeers          raftPeers
	PeerListen         string // "" listens on this member's --raft-peers address
	RaftLearner        bool
	RaftLearners       raftIDs // ids of --raft-peers that are learners, the same list on every member
	ReplicationTimeout time.Duration
	// CatchUpWindow is --raft-catchup-window: how far below the commit end
	// (bytes of commitlog) the leader keeps expired files for a follower
	// catching up from the raft log; one further behind gets a snapshot.
	CatchUpWindow sizeValue
	// CatchUpReadahead is --raft-catchup-readahead: how far the leader
	// reads ahead of a follower catching up (0, the default: off).
	CatchUpReadahead sizeValue
	PeerTLSCert      string
	PeerTLSKey       string
	PeerTLSCA        string
	// RaftTick is --raft-tick, raft's logical clock; ElectionTimeout is
	// --raft-election-timeout, a whole number of ticks above one (the
	// heartbeat is one tick). Raft randomizes each election timeout in
	// [timeout, 2 × timeout).
	RaftTick        time.Duration
	ElectionTimeout time.Duration
	// GroupName is --raft-group: the group's name, recorded in raft/meta at
	// bootstrap, checked by every later start and by the peer handshake,
	// and part of the cluster id.
	GroupName string
	// RaftJoin is --raft-join: the cluster id of an existing group this
	// member joins (added with `storaged replica add`); empty: a member of
	// the bootstrap.
	RaftJoin string
	// RaftJoinUnlisted is --raft-join-unlisted: a cluster id this member
	// joins only if --raft-peers does not list its id, so that one pod
	// template serves the bootstrap members (listed, they ignore it) and
	// the members added later (join uses it).
	RaftJoinUnlisted string
	// OrdinalIDs is --raft-ordinal-ids: with --raft-id ordinal, the pods
	// whose member id is not ordinal + 1 (a pod whose member was replaced
	// by a new one, under a new id).
	OrdinalIDs ordinalIDs
	// ordinal: --raft-id was "ordinal" (RaftID is the pod's ordinal + 1
	// until applyOrdinalIDs); remapped: OrdinalIDs gave this pod its id.
	ordinal, remapped bool
	// ForwardPuts is --raft-forward-puts: a follower hands the puts it
	// would refuse with NOT_LEADER to the leader over the peer transport.
	ForwardPuts bool
	// FollowerReads is --raft-follower-reads: a follower or learner serves
	// linearizable reads after the leader's read index.
	FollowerReads bool
	// recordedCluster is the cluster id raft/meta of the data dir records
	// (resolveCluster), "" before the first start; joined: raft/meta
	// records no bootstrap members, so this data dir joined a running group
	// (--raft-join at its first start) and keeps joining without the flag.
	recordedCluster string
	joined          bool

	// Which flags the operator set (command line or environment): a group
	// refuses --role and an explicit --flush-mode async; standalone
	// refuses the group-only ones.
	roleSet, flushModeSet, tickSet, electionSet, groupNameSet bool
}

// defaultReplicationTimeout is SyncFlushTimeout's 5 s: a put proposed and
// not committed within it is answered with an unknown outcome.
const defaultReplicationTimeout = storage.DefaultSyncFlushTimeout

// defaultGroupName is --raft-group's default, the name groups recorded
// before the flag existed.
const defaultGroupName = "default"

// Raft timing defaults (design §4): a 100 ms tick, elections after 1 s
// (10 ticks) without a leader; the heartbeat is one tick.
const (
	defaultRaftTick        = 100 * time.Millisecond
	defaultElectionTimeout = time.Second
	// maxElectionTicks bounds --raft-election-timeout / --raft-tick.
	maxElectionTicks = 1000
)

func (r *replicationConfig) register(fs *flag.FlagSet) {
	fs.Func("raft-id", "this member's raft `id`: a positive integer listed in --raft-peers, or \"ordinal\" for a "+
		"StatefulSet pod (the host name's -N suffix plus 1, or what --raft-ordinal-ids gives pod N)", func(s string) error {
		id, err := parseRaftIDFlag(s, hostname)
		r.RaftID, r.ordinal = id, err == nil && strings.TrimSpace(s) == "ordinal"
		return err
	})
	fs.Var(&r.RaftPeers, "raft-peers",
		"replication group `members` as id=host:port of their peer listeners, comma separated "+
			"(1=host1:9191,2=host2:9191,3=host3:9191); empty runs standalone")
	fs.StringVar(&r.PeerListen, "peer-listen", "",
		"peer service (storaged.peer.v1.Raft) listen `address` (default: this member's --raft-peers address)")
	fs.BoolVar(&r.RaftLearner, "raft-learner", false, "this member is a learner (replicates and serves reads, never votes or leads); "+
		"its id must be in --raft-learners")
	fs.Var(&r.RaftLearners, "raft-learners", "`ids` of --raft-peers members that are learners (non-voting replicas), comma "+
		"separated, the same list on every member; empty: every member votes")
	fs.DurationVar(&r.ReplicationTimeout, "replication-timeout", defaultReplicationTimeout,
		"group mode: a put not committed by a majority within this `duration` gets DEADLINE_EXCEEDED with outcome unknown")
	r.CatchUpWindow = sizeValue(storage.DefaultCatchUpWindow)
	fs.Var(&r.CatchUpWindow, "raft-catchup-window", "group mode: the leader keeps commitlog files that retention would delete "+
		"(--file-reserved-time) while a follower still catching up from the raft log needs them, at most this `size` below the "+
		"commit end (KiB, MiB, GiB); a follower further behind gets a snapshot (a file transfer) instead")
	fs.Var(&r.CatchUpReadahead, "raft-catchup-readahead", "group mode: the leader asks the kernel to read this `size` of "+
		"commitlog ahead of a follower more than half of it behind (KiB, MiB; at most 1GiB; 0, the default: off), so that "+
		"the entries sent to it are copied from memory, not faulted in from the disk while puts wait; try 32MiB where "+
		"storaged_raft_storage_entries_seconds shows slow reads while a follower catches up")
	fs.DurationVar(&r.RaftTick, "raft-tick", defaultRaftTick, "group mode: raft's tick `duration` (1ms to 10s); the leader "+
		"sends a heartbeat every tick")
	fs.DurationVar(&r.ElectionTimeout, "raft-election-timeout", defaultElectionTimeout, "group mode: a follower that hears "+
		"no leader for this `duration` (randomized up to twice it) starts an election; a whole number of --raft-tick, "+
		"at least 2 and at most 1000 ticks. Keep it well above the disk's fsync tail (hundreds of milliseconds on a "+
		"shared disk): a leader stalled by a slow sync loses its followers' lease")
	fs.StringVar(&r.GroupName, "raft-group", defaultGroupName, "group mode: the group's `name` (letters, digits, '.', '_', '-'; "+
		"at most 64), recorded in each member's data dir at its first start; a data dir of another group, or a peer "+
		"naming another group, is refused. Give each group its own name: it is part of the cluster id")
	fs.StringVar(&r.RaftJoin, "raft-join", "", "group mode: this member joins an existing group whose cluster id is `id` "+
		"(32 hex digits, printed by `storaged replica add`, shown by `storaged replica members`): it starts empty and "+
		"learns the membership from the leader. --raft-peers lists this member (its peer address) and the members it "+
		"can reach (or, not listing it, needs --peer-listen). Only read at the first start; later starts use the cluster "+
		"id recorded in the data dir")
	fs.StringVar(&r.RaftJoinUnlisted, "raft-join-unlisted", "", "group mode: like --raft-join `id`, but only for a member "+
		"whose id --raft-peers does not list; a member it lists is a bootstrap member and ignores it. One StatefulSet pod "+
		"template then serves both: --raft-peers names the bootstrap members, and pods beyond them join (the Helm chart sets it)")
	fs.Var(&r.OrdinalIDs, "raft-ordinal-ids", "with --raft-id ordinal: the pods whose member id is not ordinal + 1, as "+
		"`ordinal=id` pairs, comma separated (1=101: the pod whose host name ends in -1 is member 101, a new member that "+
		"joins, after its old member was removed)")
	fs.BoolVar(&r.ForwardPuts, "raft-forward-puts", false, "group mode: a follower hands a put it would refuse with NOT_LEADER "+
		"to the leader over the peer transport and answers with the leader's answer (for clients behind a Service that "+
		"spreads calls over every member and cannot follow leader hints); a forwarded call that fails in transit is "+
		"DEADLINE_EXCEEDED with outcome unknown")
	fs.BoolVar(&r.FollowerReads, "raft-follower-reads", false, "group mode: a follower or learner serves linearizable reads "+
		"(linearizable: true) itself: it asks the leader for its read index (confirmed by a quorum, as for the leader's own "+
		"reads) and answers once it has applied that far; without it a follower refuses them with NOT_LEADER")
	fs.StringVar(&r.PeerTLSCert, "peer-tls-cert", "", "peer TLS certificate `file` (PEM), presented as server and client; it must name this member's --raft-peers host")
	fs.StringVar(&r.PeerTLSKey, "peer-tls-key", "", "peer TLS private key `file` (PEM)")
	fs.StringVar(&r.PeerTLSCA, "peer-tls-ca", "", "CA `file` (PEM) that signs every member's peer certificate; TLS 1.3, client certificates required")
}

// noteSet records which of the flags that conflict with a group were set.
func (r *replicationConfig) noteSet(fs *flag.FlagSet) {
	fs.Visit(func(f *flag.Flag) {
		switch f.Name {
		case "role":
			r.roleSet = true
		case "flush-mode":
			r.flushModeSet = true
		case "raft-tick":
			r.tickSet = true
		case "raft-election-timeout":
			r.electionSet = true
		case "raft-group":
			r.groupNameSet = true
		}
	})
}

// applyOrdinalIDs gives a pod that --raft-ordinal-ids names its id
// there instead of its ordinal + 1 (after parsing: the flags come in any
// order).
func (r *replicationConfig) applyOrdinalIDs() {
	if !r.ordinal || r.RaftID == 0 {
		return
	}
	if id, ok := r.OrdinalIDs[r.RaftID-1]; ok {
		r.RaftID, r.remapped = id, true
	}
}

// join is the cluster id this member joins: --raft-join, or
// --raft-join-unlisted when --raft-peers does not list this member; ""
// for a member of the bootstrap.
func (r *replicationConfig) join() string {
	if r.RaftJoin != "" {
		return r.RaftJoin
	}
	if r.RaftJoinUnlisted != "" && r.RaftID != 0 && r.RaftPeers.addr(r.RaftID) == "" {
		return r.RaftJoinUnlisted
	}
	return ""
}

// joinFlag names the flag join's value comes from.
func (r *replicationConfig) joinFlag() string {
	if r.RaftJoin != "" {
		return "--raft-join"
	}
	return "--raft-join-unlisted"
}

// remappedNote says, for an error, which pod --raft-ordinal-ids gave its
// id to.
func (r *replicationConfig) remappedNote() string {
	for o, id := range r.OrdinalIDs {
		if r.remapped && id == r.RaftID {
			return fmt.Sprintf(" (pod ordinal %d, by --raft-ordinal-ids)", o)
		}
	}
	return ""
}

// group reports whether the configuration asks for a replication group.
func (r *replicationConfig) group() bool { return len(r.RaftPeers) > 0 }

// peerListen is the address the peer service listens on.
func (r *replicationConfig) peerListen() string {
	if r.PeerListen != "" {
		return r.PeerListen
	}
	return r.RaftPeers.addr(r.RaftID)
}

// validate checks the replication flags against each other and against the
// standalone ones (FlushMode as resolved: a group defaults to sync).
func (r *replicationConfig) validate(flushMode storage.FlushMode) []error {
	var errs []error
	if r.ReplicationTimeout <= 0 {
		errs = append(errs, fmt.Errorf("--replication-timeout %v must be positive", r.ReplicationTimeout))
	}
	if r.CatchUpWindow <= 0 {
		errs = append(errs, fmt.Errorf("--raft-catchup-window %v must be positive", r.CatchUpWindow.String()))
	}
	if r.CatchUpReadahead < 0 || r.CatchUpReadahead > storage.MaxCatchUpReadahead {
		errs = append(errs, fmt.Errorf("--raft-catchup-readahead %v must be between 0 (off) and %s", r.CatchUpReadahead.String(),
			formatSize(storage.MaxCatchUpReadahead)))
	}
	errs = append(errs, r.validateTiming()...)
	if p := groupNameProblem(r.GroupName); p != "" {
		errs = append(errs, fmt.Errorf("--raft-group %q: %s", trunc(r.GroupName), p))
	}
	tlsSet := r.PeerTLSCert != "" || r.PeerTLSKey != "" || r.PeerTLSCA != ""
	if !r.group() {
		var stray []string
		if r.RaftID != 0 {
			stray = append(stray, "--raft-id")
		}
		if r.PeerListen != "" {
			stray = append(stray, "--peer-listen")
		}
		if r.RaftLearner {
			stray = append(stray, "--raft-learner")
		}
		if len(r.RaftLearners) > 0 {
			stray = append(stray, "--raft-learners")
		}
		if tlsSet {
			stray = append(stray, "--peer-tls-*")
		}
		if r.tickSet {
			stray = append(stray, "--raft-tick")
		}
		if r.electionSet {
			stray = append(stray, "--raft-election-timeout")
		}
		if r.groupNameSet {
			stray = append(stray, "--raft-group")
		}
		if r.RaftJoin != "" {
			stray = append(stray, "--raft-join")
		}
		if r.RaftJoinUnlisted != "" {
			stray = append(stray, "--raft-join-unlisted")
		}
		if len(r.OrdinalIDs) > 0 {
			stray = append(stray, "--raft-ordinal-ids")
		}
		if r.ForwardPuts {
			stray = append(stray, "--raft-forward-puts")
		}
		if r.FollowerReads {
			stray = append(stray, "--raft-follower-reads")
		}
		if len(stray) > 0 {
			errs = append(errs, fmt.Errorf("%s need --raft-peers (without it storaged runs standalone)", strings.Join(stray, ", ")))
		}
		return errs
	}
	listed := r.RaftPeers.addr(r.RaftID) != ""
	switch {
	case r.RaftID == 0:
		errs = append(errs, errors.New("--raft-peers needs --raft-id (this member's id in the list)"))
	case !listed && r.join() == "":
		errs = append(errs, fmt.Errorf("--raft-id %d is not in --raft-peers (ids %v)%s; only a member that joins "+
			"(--raft-join, --raft-join-unlisted) may be left out", r.RaftID, r.RaftPeers.ids(), r.remappedNote()))
	case !listed && r.PeerListen == "":
		errs = append(errs, fmt.Errorf("--raft-id %d is not in --raft-peers (ids %v): a joining member it does not list "+
			"needs --peer-listen (the group reaches it at the address `storaged replica add --peer-addr` recorded)",
			r.RaftID, r.RaftPeers.ids()))
	}
	if len(r.OrdinalIDs) > 0 && !r.ordinal {
		errs = append(errs, errors.New("--raft-ordinal-ids needs --raft-id ordinal (it names pods by their ordinal)"))
	}
	if r.remapped && listed && r.join() == "" {
		errs = append(errs, fmt.Errorf("--raft-ordinal-ids makes this pod member %d%s, which --raft-peers lists as a "+
			"bootstrap member: a pod given a new id is a new member, with an id the group never used, and joins", r.RaftID,
			r.remappedNote()))
	}
	if len(r.RaftPeers) < 2 {
		errs = append(errs, errors.New("--raft-peers lists one member; a group needs at least 2 (3 or 5 to survive a failure)"))
	}
	for _, id := range r.RaftLearners {
		if r.RaftPeers.addr(id) == "" {
			errs = append(errs, fmt.Errorf("--raft-learners %d is not in --raft-peers (ids %v)", id, r.RaftPeers.ids()))
		}
	}
	if len(r.voters()) == 0 {
		errs = append(errs, errors.New("--raft-learners lists every member: a group needs at least one voter"))
	}
	if r.RaftLearner && r.RaftID != 0 && !slices.Contains(r.RaftLearners, r.RaftID) {
		errs = append(errs, fmt.Errorf("--raft-learner: add this member's id %d to --raft-learners, on every member "+
			"(each member must know the learners from the first start)", r.RaftID))
	}
	if r.RaftJoin != "" && r.RaftJoinUnlisted != "" {
		errs = append(errs, errors.New("--raft-join and --raft-join-unlisted: give one (--raft-join-unlisted joins only a "+
			"member --raft-peers does not list)"))
	}
	if r.RaftJoinUnlisted != "" {
		if p := clusterIDProblem(r.RaftJoinUnlisted); p != "" {
			errs = append(errs, fmt.Errorf("--raft-join-unlisted %q: %s", trunc(r.RaftJoinUnlisted), p))
		}
	}
	if r.RaftJoin != "" {
		if p := clusterIDProblem(r.RaftJoin); p != "" {
			errs = append(errs, fmt.Errorf("--raft-join %q: %s", trunc(r.RaftJoin), p))
		}
	}
	if r.join() != "" {
		if len(r.RaftLearners) > 0 || r.RaftLearner {
			errs = append(errs, errors.New("--raft-join takes no --raft-learners nor --raft-learner: a joining member is "+
				"added as a learner and learns every role from the group"))
		}
	}
	if r.roleSet {
		errs = append(errs, errors.New("--role is for standalone master/slave; in a group (--raft-peers) the leader is elected "+
			"(use --raft-learners for non-voting replicas)"))
	}
	if r.flushModeSet && flushMode == storage.FlushAsync {
		errs = append(errs, errors.New("--flush-mode async is refused with --raft-peers: a replica must fsync before it "+
			"acknowledges, or it may vote for a leader lacking acknowledged messages"))
	}
	if r.PeerListen != "" {
		if err := checkHostPort(r.PeerListen, true); err != nil {
			errs = append(errs, fmt.Errorf("--peer-listen: %w", err))
		}
	}
	if tlsSet && (r.PeerTLSCert == "" || r.PeerTLSKey == "" || r.PeerTLSCA == "") {
		errs = append(errs, errors.New("--peer-tls-cert, --peer-tls-key and --peer-tls-ca go together"))
	}
	if !tlsSet {
		for _, p := range r.RaftPeers {
			if !peer.IsLoopback(p.addr) {
				errs = append(errs, fmt.Errorf("--raft-peers member %d at %s is not loopback: set --peer-tls-cert, "+
					"--peer-tls-key and --peer-tls-ca (plaintext peer traffic is allowed on loopback only)", p.id, p.addr))
			}
		}
		if r.PeerListen != "" && !peer.IsLoopback(r.PeerListen) {
			errs = append(errs, fmt.Errorf("--peer-listen %s is not loopback: set --peer-tls-cert, --peer-tls-key and "+
				"--peer-tls-ca (plaintext peer traffic is allowed on loopback only)", r.PeerListen))
		}
	}
	return errs
}

// validateTiming checks --raft-tick and --raft-election-timeout: the
// tick in [1ms, 10s], the election timeout a whole number of ticks from
// 2 (above the one-tick heartbeat) to maxElectionTicks.
func (r *replicationConfig) validateTiming() []error {
	if r.RaftTick < time.Millisecond || r.RaftTick > 10*time.Second {
		return []error{fmt.Errorf("--raft-tick %v: want 1ms to 10s", r.RaftTick)}
	}
	n := r.ElectionTimeout / r.RaftTick
	switch {
	case r.ElectionTimeout%r.RaftTick != 0:
		return []error{fmt.Errorf("--raft-election-timeout %v is not a whole number of --raft-tick %v", r.ElectionTimeout, r.RaftTick)}
	case n < 2 || n > maxElectionTicks:
		return []error{fmt.Errorf("--raft-election-timeout %v is %d ticks of --raft-tick %v: want 2 to %d (the heartbeat is one tick)",
			r.ElectionTimeout, n, r.RaftTick, maxElectionTicks)}
	}
	return nil
}

// groupNameProblem says why name cannot name a group, or "".
func groupNameProblem(name string) string {
	if name == "" || len(name) > 64 {
		return "want 1 to 64 characters"
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return "want letters, digits, '.', '_' and '-' only"
		}
	}
	return ""
}

// trunc shortens s for an error message.
func trunc(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// raftPeer is one --raft-peers member.
type raftPeer struct {
	id   uint64
	addr string
}

// raftPeers is the --raft-peers list, in the order given.
type raftPeers []raftPeer

func (p *raftPeers) String() string {
	if p == nil {
		return ""
	}
	parts := make([]string, len(*p))
	for i, m := range *p {
		parts[i] = strconv.FormatUint(m.id, 10) + "=" + m.addr
	}
	return strings.Join(parts, ",")
}

// Set parses "1=host1:9191,2=host2:9191,3=host3:9191"; the empty string
// clears the list (standalone).
func (p *raftPeers) Set(s string) error {
	var out raftPeers
	if strings.TrimSpace(s) == "" {
		*p = nil
		return nil
	}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		idStr, addr, ok := strings.Cut(part, "=")
		if !ok {
			return fmt.Errorf("member %q: want id=host:port", part)
		}
		id, err := parseRaftID(idStr)
		if err != nil {
			return fmt.Errorf("member %q: %w", part, err)
		}
		if err := checkHostPort(addr, false); err != nil {
			return fmt.Errorf("member %q: %w", part, err)
		}
		if out.addr(id) != "" {
			return fmt.Errorf("member id %d listed twice", id)
		}
		for _, m := range out {
			if m.addr == addr {
				return fmt.Errorf("address %s listed for members %d and %d", addr, m.id, id)
			}
		}
		out = append(out, raftPeer{id, addr})
	}
	*p = out
	return nil
}

func (p raftPeers) addr(id uint64) string {
	for _, m := range p {
		if m.id == id {
			return m.addr
		}
	}
	return ""
}

func (p raftPeers) ids() []uint64 {
	ids := make([]uint64, len(p))
	for i, m := range p {
		ids[i] = m.id
	}
	slices.Sort(ids)
	return ids
}

// peerMap is the list as peer.Options.Peers takes it.
func (p raftPeers) peerMap() map[uint64]string {
	m := make(map[uint64]string, len(p))
	for _, x := range p {
		m[x.id] = x.addr
	}
	return m
}

// raftIDs is the --raft-learners list: distinct positive ids, sorted.
type raftIDs []uint64

func (l *raftIDs) String() string {
	if l == nil {
		return ""
	}
	parts := make([]string, len(*l))
	for i, id := range *l {
		parts[i] = strconv.FormatUint(id, 10)
	}
	return strings.Join(parts, ",")
}

// Set parses "4" or "4,5"; the empty string clears the list.
func (l *raftIDs) Set(s string) error {
	var out raftIDs
	if strings.TrimSpace(s) == "" {
		*l = nil
		return nil
	}
	for _, part := range strings.Split(s, ",") {
		id, err := parseRaftID(part)
		if err != nil {
			return err
		}
		if slices.Contains(out, id) {
			return fmt.Errorf("id %d listed twice", id)
		}
		out = append(out, id)
	}
	slices.Sort(out)
	*l = out
	return nil
}

// voters are the --raft-peers ids that are not learners.
func (r *replicationConfig) voters() []uint64 {
	var v []uint64
	for _, id := range r.RaftPeers.ids() {
		if !slices.Contains(r.RaftLearners, id) {
			v = append(v, id)
		}
	}
	return v
}

// ordinalIDs is the --raft-ordinal-ids list: pod ordinal -> member id.
type ordinalIDs map[uint64]uint64

func (m *ordinalIDs) String() string {
	if m == nil {
		return ""
	}
	parts := make([]string, 0, len(*m))
	for _, o := range slices.Sorted(maps.Keys(*m)) {
		parts = append(parts, fmt.Sprintf("%d=%d", o, (*m)[o]))
	}
	return strings.Join(parts, ",")
}

// Set parses "1=101" or "1=101,3=102"; the empty string clears the list.
// An ordinal or an id given twice is refused.
func (m *ordinalIDs) Set(s string) error {
	if strings.TrimSpace(s) == "" {
		*m = nil
		return nil
	}
	out := ordinalIDs{}
	owner := map[uint64]uint64{} // id -> ordinal
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		ordStr, ids, ok := strings.Cut(part, "=")
		if !ok {
			return fmt.Errorf("%q: want ordinal=id", part)
		}
		o, err := strconv.ParseUint(strings.TrimSpace(ordStr), 10, 32)
		if err != nil {
			return fmt.Errorf("%q: ordinal %q: want a pod ordinal (0, 1, ...)", part, ordStr)
		}
		id, err := parseRaftID(ids)
		if err != nil {
			return fmt.Errorf("%q: %w", part, err)
		}
		if _, dup := out[o]; dup {
			return fmt.Errorf("pod ordinal %d listed twice", o)
		}
		if prev, dup := owner[id]; dup {
			return fmt.Errorf("member id %d given to pods %d and %d", id, prev, o)
		}
		out[o], owner[id] = id, o
	}
	*m = out
	return nil
}

// hostname is the host name --raft-id ordinal reads (a test seam).
var hostname = os.Hostname

// parseRaftIDFlag is --raft-id: an id, or "ordinal", which derives it from
// the host name of a StatefulSet pod (name-N is member N+1), so that one
// pod template serves every member: Kubernetes gives each pod a stable
// name and ordinal, and the chart lists the members 1..replicas by them.
func parseRaftIDFlag(s string, hostname func() (string, error)) (uint64, error) {
	if strings.TrimSpace(s) != "ordinal" {
		return parseRaftID(s)
	}
	h, err := hostname()
	if err != nil {
		return 0, fmt.Errorf("raft id ordinal: %w", err)
	}
	i := strings.LastIndexByte(h, '-')
	n, err := strconv.ParseUint(h[i+1:], 10, 32)
	if i < 0 || err != nil {
		return 0, fmt.Errorf("raft id ordinal: host name %q does not end in -N (a StatefulSet pod's ordinal)", h)
	}
	return n + 1, nil
}

func parseRaftID(s string) (uint64, error) {
	id, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
	if err != nil || id == 0 {
		return 0, fmt.Errorf("raft id %q: want a positive integer", s)
	}
	return id, nil
}

// checkHostPort accepts host:port with a numeric port in 1-65535 (0 too
// for a listener, to pick a free one) and, for a peer address, a host.
func checkHostPort(addr string, listen bool) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	n, err := strconv.ParseUint(port, 10, 16)
	if err != nil || (n == 0 && !listen) {
		return fmt.Errorf("address %q: port %q is not a number in 1-65535", addr, port)
	}
	if host == "" && !listen {
		return fmt.Errorf("address %q has no host", addr)
	}
	if strings.ContainsAny(host, " /") {
		return fmt.Errorf("address %q: bad host", addr)
	}
	return nil
}

// startTransport opens the peer listener and starts the raft transport of
// this member. clientAddr is this member's client gRPC address, named to
// the peers so that followers can point clients at the leader. The
// stepper is attached later (peer.Transport.SetStepper), once the store
// is open.
func (r *replicationConfig) startTransport(clientAddr string, logger *zerolog.Logger) (*peer.Transport, error) {
	var tlsCfg *peer.TLS
	if r.PeerTLSCert != "" {
		var err error
		if tlsCfg, err = peer.LoadTLS(r.PeerTLSCert, r.PeerTLSKey, r.PeerTLSCA); err != nil {
			return nil, err
		}
	}
	lis, err := net.Listen("tcp", r.peerListen())
	if err != nil {
		return nil, fmt.Errorf("--peer-listen: %w", err)
	}
	return peer.New(lis, nil, peer.Options{
		Group: r.GroupName, ClusterID: r.groupClusterID(), ID: r.RaftID, Peers: r.RaftPeers.peerMap(), ClientAddr: clientAddr, TLS: tlsCfg, Logger: logger,
	})
}

// clusterID identifies the group in the peer handshake and in raft/meta:
// a digest of the group's name, the sorted member ids and the learners
// (the name and the learners only when set: a group named "default"
// without learners keeps the digest it had before either existed), so a
// member started with another --raft-group, --raft-peers or
// --raft-learners is refused by its peers and by its own data dir, and
// two groups with the same ids but different names never accept each
// other's messages. Addresses may change between starts; ids, roles and
// the name may not.
func (r *replicationConfig) clusterID() string {
	ids := r.RaftPeers.ids()
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = strconv.FormatUint(id, 10)
	}
	key := "storaged-group/" + strings.Join(parts, ",")
	if len(r.RaftLearners) > 0 {
		key += "/learners/" + r.RaftLearners.String()
	}
	if r.GroupName != defaultGroupName {
		key += "/name/" + r.GroupName
	}
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:16])
}

// clusterIDProblem checks a --raft-join value: a cluster id as clusterID
// makes them (32 lower-case hex digits).
func clusterIDProblem(id string) string {
	if len(id) != 32 {
		return "want the group's cluster id, 32 hex digits"
	}
	if _, err := hex.DecodeString(id); err != nil || strings.ToLower(id) != id {
		return "want the group's cluster id, 32 lower-case hex digits"
	}
	return ""
}

// resolveCluster reads the cluster id raft/meta of dataDir records, if
// it has one: a member's cluster id is fixed at its first start (the
// digest of the bootstrap flags, or --raft-join), and once the membership
// changed the flags' member list no longer digests to it.
func (r *replicationConfig) resolveCluster(dataDir string) error {
	meta, err := storage.ReadReplicaMeta(storage.Options{Dir: dataDir})
	if err != nil {
		// None yet (the first start), or a damaged one: storage.Open
		// refuses that with the repair to run.
		return nil
	}
	if j := r.join(); j != "" && meta.ClusterUUID != j {
		return fmt.Errorf("%s %s: the data dir %s belongs to cluster %s", r.joinFlag(), j, dataDir, meta.ClusterUUID)
	}
	r.recordedCluster = meta.ClusterUUID
	r.joined = len(meta.Voters) == 0 && len(meta.Learners) == 0
	return nil
}

// groupClusterID is the cluster id this member uses: the one its data dir
// records, else --raft-join's, else the digest of the flags (clusterID).
func (r *replicationConfig) groupClusterID() string {
	switch {
	case r.recordedCluster != "":
		return r.recordedCluster
	case r.join() != "":
		return r.join()
	}
	return r.clusterID()
}

// groupOptions makes the store a member of the group, sending through tr.
func (r *replicationConfig) groupOptions(tr storage.Transport) *storage.GroupOptions {
	return &storage.GroupOptions{
		ID: r.RaftID, Name: r.GroupName, ClusterID: r.groupClusterID(), Join: r.join() != "" || r.joined,
		Peers: r.voters(), Learners: slices.Clone(r.RaftLearners),
		Transport: tr, ReplicationTimeout: r.ReplicationTimeout, CatchUpWindow: int64(r.CatchUpWindow),
		CatchUpReadahead: int64(r.CatchUpReadahead), FollowerReads: r.FollowerReads,
		TickInterval: r.RaftTick, ElectionTick: int(r.ElectionTimeout / r.RaftTick), HeartbeatTick: 1,
	}
}

// groupRuntime holds what the service reads in group mode once it exists:
// the transport (the members' client addresses) and the open store.
type groupRuntime struct {
	transport atomic.Pointer[peer.Transport]
	store     atomic.Pointer[storage.Store]
	// name and cluster identify the group, selfAddr is this member's
	// --raft-peers address (set before the transport).
	name, cluster, selfAddr string
	selfID                  uint64
	peerTLS                 bool // --peer-tls-* set
}

// adminOption gives the admin service the group's identity, the peer
// addresses and the leader hints of refused membership changes.
func (g *groupRuntime) adminOption() server.AdminOption {
	return server.WithAdminGroup(func() server.AdminGroup {
		out := server.AdminGroup{ClusterID: g.cluster, Group: g.name, ClientAddr: func(uint64) string { return "" },
			PeerAddrProblem: g.peerAddrProblem}
		if tr := g.transport.Load(); tr != nil {
			out.PeerAddrs = g.peerAddrs(tr)
			out.ClientAddr = tr.ClientAddr
		}
		return out
	})
}

// peerAddrProblem refuses a new member's peer address that this
// member's transport would refuse (SetPeer): not host:port, or plaintext
// off loopback.
func (g *groupRuntime) peerAddrProblem(addr string) string {
	if err := checkHostPort(addr, false); err != nil {
		return err.Error()
	}
	if !g.peerTLS && !peer.IsLoopback(addr) {
		return "not a loopback address, and the group's peer traffic is plaintext (no --peer-tls-*)"
	}
	return ""
}

// peerAddrs are the transport's peers and this member at its address.
func (g *groupRuntime) peerAddrs(tr *peer.Transport) map[uint64]string {
	addrs := tr.Peers()
	if g.selfAddr != "" {
		addrs[g.selfID] = g.selfAddr
	}
	return addrs
}

// memberSync keeps the peer transport following the group's membership
// (GroupOptions.OnMembership, and once at start from Store.Membership):
// every member gets a link, at its --raft-peers address when the flags
// list it (addresses may change between starts), else at the address its
// conf change recorded; a removed member's link goes. This member's own
// address, found the same way, is the one its batches name (so that a
// member that has not heard of it yet can answer it). Updates older than
// the last one applied are ignored (the start-up one may race the raft
// goroutine's).
type memberSync struct {
	tr    *peer.Transport
	self  uint64
	flags map[uint64]string
	log   *zerolog.Logger

	mu      sync.Mutex
	applied bool
	index   uint64
}

func (m *memberSync) apply(u storage.MembershipUpdate) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.applied && u.Membership.Index < m.index {
		return
	}
	m.applied, m.index = true, u.Membership.Index
	ids := u.Membership.Members()
	for id := range u.PeerAddrs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range slices.Compact(ids) {
		if slices.Contains(u.Removed, id) {
			continue
		}
		addr := m.flags[id]
		if addr == "" {
			addr = u.PeerAddrs[id]
		}
		if addr == "" {
			continue
		}
		if err := m.tr.SetPeer(id, addr); err != nil {
			m.log.Warn().Err(err).Uint64("peer", id).Str("peer_addr", addr).Msg("membership change: cannot reach the new member")
		}
	}
	for _, id := range u.Removed {
		if id != m.self {
			m.tr.RemovePeer(id)
		}
	}
}

// serverOption feeds GetReplicaInfo and the leader hints of refused puts.
func (g *groupRuntime) serverOption(id uint64) server.Option {
	addr := func(id uint64) string {
		if tr := g.transport.Load(); tr != nil {
			return tr.ClientAddr(id)
		}
		return ""
	}
	return server.WithReplication(g.info(id), addr)
}

// forwarder takes a follower's puts to the leader through the peer
// transport, once it runs (before: nothing is sent, the put is refused
// as without forwarding).
func (g *groupRuntime) forwarder() server.Forwarder { return groupForwarder{g} }

type groupForwarder struct{ g *groupRuntime }

func (f groupForwarder) ForwardPut(ctx context.Context, to uint64, req *peerv1.ForwardPutRequest) (*peerv1.ForwardPutResponse, error) {
	tr := f.g.transport.Load()
	if tr == nil {
		return nil, peer.ErrNoRoute
	}
	return tr.ForwardPut(ctx, to, req)
}

// info is the member's view of its group for GetReplicaInfo and the
// storaged_raft_* metrics. Before the store is open it says only this
// member's id.
func (g *groupRuntime) info(id uint64) func() server.ReplicaInfo {
	return func() server.ReplicaInfo {
		st := g.store.Load()
		if st == nil {
			return server.ReplicaInfo{ID: id}
		}
		ri := st.ReplicaInfo()
		out := server.ReplicaInfo{Role: ri.Role, ID: ri.ID, Term: ri.Term, LeaderID: ri.LeaderID, Commit: ri.Commit,
			Applied: ri.Applied, CommitEnd: ri.CommitEnd, Ready: ri.Ready,
			ReadaheadBytes: ri.ReadaheadBytes, Readaheads: ri.Readaheads, StorageEntries: ri.StorageEntries,
			LeadersForgotten: ri.LeadersForgotten, EarlyCampaigns: ri.EarlyCampaigns,
			ReadyHandling: ri.ReadyHandling, LogSync: ri.LogSync, ClusterID: g.cluster, Group: g.name,
			TickInterval: ri.TickInterval, ElectionTicks: ri.ElectionTick}
		if u, err := st.Membership(); err == nil {
			var addrs map[uint64]string
			if tr := g.transport.Load(); tr != nil {
				addrs = g.peerAddrs(tr)
			}
			out.Membership = server.MembershipOf(u, addrs)
		}
		for _, p := range ri.Peers {
			out.Peers = append(out.Peers, server.PeerProgress{ID: p.ID, Match: p.Match, Next: p.Next,
				RecentActive: p.RecentActive, Learner: p.Learner})
		}
		return out
	}
}

// repairSource is the --from a refused start suggests: every other
// member of --raft-peers (repair takes an entry from the first that holds
// it, and a lost HardState or an uncommitted entry no member holds needs
// to hear from most of them).
func (r *replicationConfig) repairSource() string {
	var parts []string
	for _, p := range r.RaftPeers {
		if p.id != r.RaftID {
			parts = append(parts, fmt.Sprintf("%d=%s", p.id, p.addr))
		}
	}
	if len(parts) == 0 {
		return "ID=HOST:PORT"
	}
	return strings.Join(parts, ",")
}

// repairIdentity is the flags a refused start suggests to `storaged
// replica repair` when raft/meta is damaged: who this member is.
func (r *replicationConfig) repairIdentity() string {
	s := fmt.Sprintf(" --raft-id %d --raft-peers %s", r.RaftID, shellQuote(r.RaftPeers.String()))
	if r.GroupName != defaultGroupName {
		s += " --raft-group " + shellQuote(r.GroupName)
	}
	if len(r.RaftLearners) > 0 {
		s += " --raft-learners " + r.RaftLearners.String()
	}
	return s
}

// storeRanger serves the FetchRange and FetchState peer RPCs from the
// store.
type storeRanger struct{ st *storage.Store }

func (s storeRanger) State() (peer.State, error) {
	r, err := s.st.ReplicaState()
	m := r.Meta
	return peer.State{NodeID: m.NodeID, Group: m.Group, ClusterID: m.ClusterUUID, FileSize: m.FileSize, LogBase: m.LogBase,
		Voters: m.Voters, Learners: m.Learners, Term: r.Term, Commit: r.Commit, First: r.First, Last: r.Last, Joining: r.Joining}, err
}

func (s storeRanger) ReadRange(lo, hi uint64, maxBytes int) (peer.Range, error) {
	r, err := s.st.ReadRaftRange(lo, hi, maxBytes)
	if errors.Is(err, storage.ErrCorrupt) {
		err = fmt.Errorf("%w: %w", peer.ErrDamaged, err)
	}
	out := peer.Range{Commit: r.Commit, Last: r.Last}
	for _, e := range r.Entries {
		out.Entries = append(out.Entries, peer.RangeEntry{Index: e.Index, Unit: e.Unit, Data: e.Data})
	}
	return out, err
}
