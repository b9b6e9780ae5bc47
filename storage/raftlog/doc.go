// Package raftlog is a replica's Raft log over the commitlog (design
// replication.md §2, Option A: the Raft log is the commitlog): it
// implements raft.Storage for etcd-raft's RawNode and the write side the
// raft loop calls per Ready.
//
// # What it owns
//
// The raft directory of a replica (the store's Dir/raft):
//
//	raft/meta                 node id, group, cluster UUID, commitlog file
//	                          size, bootstrap members: written once at
//	                          bootstrap (sealed JSON); a later Open with
//	                          another id, group, cluster or size is refused
//	raft/hardstate            two 64 B slots {seq, term, vote, commit,
//	                          CRC-32C}, written alternately with one
//	                          fdatasync and no rename; the valid slot with
//	                          the highest seq wins
//	raft/index/<first index>  preallocated mapped files of fixed 32 B units,
//	                          one per raft index (Unit): term, pos, len,
//	                          kind (DATA, EMPTY, CONF, CMD), flags (bit0: an
//	                          END_OF_FILE blank precedes the bytes), CRC-32C
//	                          of the payload and of the unit
//	raft/meta-log/<offset>    the payloads of CONF and CMD entries, appended
//	                          (their CRC-32C is in the unit)
//
// A DATA entry is a normal entry whose data are RocketMQ records (magic at
// +4): its bytes live in the commitlog at the offset the leader stamped
// into their PHYSICALOFFSET fields, and only there; the unit says where.
// So the commitlog of every replica is byte-identical up to the commit
// point, blanks included (commitlog.PlaceAt writes the blank a leader's
// roll would). An EMPTY entry (a new term's first) has no payload; any
// other normal entry is a CMD (a storaged command) and goes to the
// meta-log with the CONF entries.
//
// # Leader and follower write the same way
//
// The put path on a leader only stamps (queue offsets, PHYSICALOFFSET,
// store time, from the tail it keeps: NextPos and Place give the roll rule)
// and proposes; it never calls commitlog.Append in a group. The bytes reach
// the commitlog when raft hands the entries back in Ready.Entries and the
// raft loop calls Append, exactly as on a follower. One path to disk means
// one set of invariants to recover, and a leader's entry is never in the
// commitlog before it is in the raft log.
//
// Per Ready the raft loop calls Append(rd.Entries) (truncating an
// uncommitted suffix first when the entries start at or below LastIndex,
// design §2.3), SetHardState(rd.HardState) when it is set, then Sync:
// one msync of the commitlog range, the meta-log's fsync, one msync of the
// index units, and the HardState slot with its fdatasync. Messages that
// acknowledge the entries go out only after Sync returned.
//
// # Recovery
//
// The store first reads CommitEnd (the commitlog offset past the last
// committed DATA entry) and recovers the commitlog with max(checkpoint
// flushed, CommitEnd) as its flushed offset, so a damaged committed record
// is refused there, never cut as a torn tail. Then
// Open reconciles the index with the (already recovered) commitlog (§3.4
// steps 2-5, recover.go): the durable end is the last unit that holds and
// whose payload is there; everything past it is cut, keeping copies
// (.broken); damage below max(HardState.Commit, the checkpoint's flushed
// offset) is a *CorruptionError and the replica refuses to start.
//
// Past the commit index a replica may have acknowledged entries too, so
// damage there is cut only when it is torn: the store recovers the
// commitlog with commitlog.RecoverGroup and SyncedData (the extents of
// the uncommitted entries whose units hold: their bytes were copied before
// the unit was written, so a kill -9 never leaves them half copied), which
// cuts a bad record there only when one of its 512 B sectors is all zero
// (etcd's isTornEntry rule: a power cut leaves unwritten sectors zero, as
// the files are zero before they are written and truncation zeroes and
// syncs); and recover cuts a bad unit only when no unit that holds follows
// it (a kill -9 tears only the unit being written). Anything else is a
// *CorruptionError.
//
// # Repair
//
// Repair (repair.go) is the offline way past such an error: it fetches the
// damaged entries from a peer (ReadRange serves them there), takes one
// only when raft's Log Matching makes it the same entry (an identical
// unit; or an identical unit of a later entry this replica still holds;
// or committed on both sides), checks its records and rewrites payload
// then unit in place, synced.
//
// # Joining
//
// A raft dir bootstrapped empty carries raft/joining until the replica has
// caught up with a leader once (Joining, Joined; the replica package
// withholds votes meanwhile): a member whose data dir was wiped comes
// back through a bootstrap and must not vote with a log that forgot
// entries it acknowledged.
//
// # What it must never do
//
//   - truncate at or below the commit index (ErrTruncateCommitted), or
//     truncate acknowledged entries at recovery: a replica that forgets
//     entries it helped commit can elect a leader that lacks them;
//   - hand out bytes it did not copy (retention may unmap a file) or bytes
//     whose CRC fails;
//   - continue after a failed write: every error stops the Log and a
//     restart recovers (the sticky-error rule);
//   - import anything above it: the raft dependency stays in this package
//     (the storage facade and consumequeue never import raft).
//
// # Not built yet
//
// Snapshot returns the base (FirstIndex-1, its term, the bootstrap
// ConfState, no data: the sender builds the manifest; InstallSnapshot and
// InstallBase reset the log to a snapshot's base; CompactBelow is
// retention's compaction). Not built: dropping the meta-log's payloads
// below the base on a plain Compact, repair of raft/meta or raft/hardstate,
// and the checkpoint's raft fields (§3.6: the raft loop must record
// DurableEnd, not the commitlog's flushed offset, as flushed).
package raftlog
