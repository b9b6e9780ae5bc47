package replica

import (
	pb "go.etcd.io/raft/v3/raftpb"
)

// coalesce shrinks one Ready's outgoing messages without changing what
// they tell their receivers, so that a put costs the peers one raft
// message per Ready rather than one each.
//
// Raft sends an append per proposal: every Propose broadcasts a MsgApp
// of that one entry to each follower in StateReplicate (etcd-raft's
// maybeSendAppend), and each follower answers each of them. Under 64
// concurrent puts a Ready of the leader holds a dozen or more MsgApps
// per follower, each marshalled, sent, unmarshalled and stepped on its
// own, and as many MsgAppResps come back, each stepped under the node's
// lock (BENCHMARKS.md "Coalesced appends"). Two rewrites, per
// destination, of a message with the one sent just before it to the same
// peer (never across another message to that peer):
//
//   - Contiguous MsgApps of one term merge: the second's previous entry
//     (Index, LogTerm) is the first's last entry, or the first's own
//     (Index, LogTerm) when the first carries no entries. The merged
//     append carries the first's (Index, LogTerm), both entry runs and
//     the higher commit: a follower that takes it is where it would be
//     after taking both, and one that rejects it would have rejected the
//     first (its answer names the first's Index, which the leader's
//     progress knows). Its single answer acknowledges the last index, and
//     raft's Inflights.FreeLE frees every append it covers. Merging stops
//     at maxSizePerMsg bytes of entries, raft's own bound for one append.
//     Empty appends merge too: raft sends one to every follower each time
//     its commit moves (bcastAppend, to carry the new commit) and as a
//     probe, and one between two appends to a follower used to stop
//     their merge (about four raft messages per follower per Ready at
//     unary-c64 before, one after: BENCHMARKS.md "Empty appends merge").
//     An empty append adds no inflight to raft's progress, so dropping
//     it into its neighbour costs the leader nothing it counts; a
//     follower that gets the merged append is where the empty one and
//     then the other would have put it (its commit is min(commit, last
//     new index) either way).
//   - Accepting MsgAppResps of one term merge into the one with the
//     higher index: the leader's progress only ever moves to the highest
//     index acknowledged (Progress.MaybeUpdate), so an accepting answer
//     below a later one tells it nothing the later one does not.
//     Rejections are never merged: each carries its own hint.
//
// coalesce owns msgs (raft hands a Ready's messages over) but not the
// entry slices in them, which may share raft's unstable log: a merged
// run gets a slice of its own.
func coalesce(msgs []*pb.Message) []*pb.Message {
	if len(msgs) < 2 {
		return msgs
	}
	out := msgs[:0]
	last := map[uint64]int{}  // destination -> index in out of the last message to it
	owned := map[uint64]int{} // destination -> bytes of entries, for a MsgApp whose Entries coalesce allocated
	for _, m := range msgs {
		to := m.GetTo()
		if i, ok := last[to]; ok {
			p := out[i]
			if mergeApp(p, m, owned, to) {
				continue
			}
			if answersSame(p, m) {
				if m.GetIndex() > p.GetIndex() {
					out[i] = m
				}
				continue
			}
		}
		delete(owned, to)
		last[to] = len(out)
		out = append(out, m)
	}
	clear(msgs[len(out):]) // drop the merged messages' references
	return out
}

// mergeApp appends m's entries to p when both are appends of one term
// and m continues p (coalesce). owned tracks the merged messages whose
// Entries slice is coalesce's, and their entries' payload bytes.
func mergeApp(p, m *pb.Message, owned map[uint64]int, to uint64) bool {
	if p.GetType() != pb.MsgApp || m.GetType() != pb.MsgApp || p.GetTerm() != m.GetTerm() {
		return false
	}
	lastIndex, lastTerm := p.GetIndex(), p.GetLogTerm()
	if n := len(p.Entries); n > 0 {
		lastIndex, lastTerm = p.Entries[n-1].GetIndex(), p.Entries[n-1].GetTerm()
	}
	if m.GetIndex() != lastIndex || m.GetLogTerm() != lastTerm {
		return false
	}
	if len(m.Entries) > 0 {
		size, mine := owned[to]
		if !mine {
			size = payload(p.Entries)
		}
		add := payload(m.Entries)
		if size+add > maxSizePerMsg {
			return false
		}
		if !mine {
			p.Entries = append(make([]*pb.Entry, 0, 2*(len(p.Entries)+len(m.Entries))), p.Entries...)
		}
		p.Entries = append(p.Entries, m.Entries...)
		owned[to] = size + add
	}
	if m.GetCommit() > p.GetCommit() {
		p.Commit = m.Commit
	}
	return true
}

// answersSame: p and m are accepting answers to appends of one term, of
// which the one with the higher index tells the leader all (coalesce).
func answersSame(p, m *pb.Message) bool {
	return p.GetType() == pb.MsgAppResp && m.GetType() == pb.MsgAppResp && p.GetTerm() == m.GetTerm() &&
		!p.GetReject() && !m.GetReject()
}

// payload is the bytes of the entries' data, as raft counts them against
// MaxSizePerMsg.
func payload(ents []*pb.Entry) int {
	n := 0
	for _, e := range ents {
		n += len(e.GetData())
	}
	return n
}
