package replica

import (
	"slices"

	"go.etcd.io/raft/v3"
)

// A leader whose process died (kill -9, a crash, the OOM killer) leaves
// its followers waiting out raft's election timeout: 1 to 2 s from its
// last message at the default ticks. And with CheckQuorum, a follower
// ignores a pre-vote while it has heard from a leader within the last
// election timeout by its own ticks (raft's lease); the two followers'
// tick phases differ, so the first to campaign was now and then ignored
// and campaigned again an election timeout later (BENCHMARKS.md "A real
// run on Kubernetes": 1.9-2.8 s without an ack after a kill -9).
//
// The kernel ends the TCP connections of a process that dies, so its
// peers' transports learn at once that it is gone: their stream to it
// ends, the next attempts fail (refused, or answered by a proxy in front
// of it) and nothing more comes from it (server/peer reports that as
// PeerGone). A follower told that of its leader forgets it (raft's
// ForgetLeader: it grants pre-votes at once, and turns back into a plain
// follower if the leader speaks again), and the surviving voters
// campaign one after the other, a tick apart in the order of their ids,
// until one of them leads.
//
// A report that is wrong (the leader lives, only this follower's
// connection broke) costs nothing: pre-votes change no term, and the
// leader and every follower still hearing it ignore them (CheckQuorum's
// lease), so no leader is deposed by one member's view. Only when a
// majority of the voters has lost the leader does a new one win; that is
// the moment raft's own timeout would have elected one anyway, a second
// or two later.

// hurry is a follower's early election after PeerGone: from tick at on
// it campaigns every every ticks, while it knows no leader and is not a
// candidate already, until tick until.
type hurry struct {
	at, every, until uint64
}

// PeerGone tells the node that the process of member id is gone: the
// transport's stream to it ended, and the next two attempts failed with
// nothing heard from it. It acts only when id is this follower's leader
// (see above); otherwise it does nothing. It returns at once (the
// campaigns run on the loop's ticks).
func (n *Node) PeerGone(id uint64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := n.rn.BasicStatus()
	if n.err != nil || id == raft.None || st.RaftState != raft.StateFollower || st.Lead != id {
		return
	}
	if err := n.rawLocked().ForgetLeader(); err != nil {
		return
	}
	n.forgotten++
	n.opts.Logger.Infof("replica %d: leader %d is gone (its stream ended, nothing heard since): forgot it (term %d)", n.opts.ID, id, st.GetTerm())
	// The voters that may still be up, this one among them; a learner or
	// a member that is still catching up (joining) only grants votes.
	var up []uint64
	for _, v := range n.members.Voters {
		if v != id {
			up = append(up, v)
		}
	}
	slices.Sort(up)
	rank := slices.Index(up, n.opts.ID)
	if rank < 0 || n.joining {
		return
	}
	// The first campaign waits for the next tick even for the first in
	// line: the other followers learn of the death within a millisecond
	// or so of this one, and a pre-vote that reaches one before it forgot
	// the leader is dropped unanswered.
	n.hurry = hurry{at: n.ticks + 1 + uint64(rank), every: uint64(len(up)), until: n.ticks + uint64(n.opts.ElectionTick)}
}

// hurryLocked runs on every tick: the next early campaign, if one is due
// (see hurry). REQUIRES: n.mu.
func (n *Node) hurryLocked() {
	h := &n.hurry
	if h.until == 0 {
		return
	}
	st := n.rn.BasicStatus()
	if n.ticks > h.until || st.Lead != raft.None || st.RaftState == raft.StateCandidate || st.RaftState == raft.StateLeader {
		*h = hurry{} // a leader is known or a vote is under way: raft takes it from here
		return
	}
	if n.ticks < h.at {
		return
	}
	h.at += h.every
	if err := n.rawLocked().Campaign(); err == nil {
		n.earlyCampaigns++
	}
}
