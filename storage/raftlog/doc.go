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
//	                          CRC-32C}, never overwriting the newest
//	                          synced one, no rename; the valid slot with
//	                          the highest seq wins; fdatasync'd when term
//	                          or vote changes, a commit-only change rides
//	                          along (hardstate.go); the first slot is
//	                          written at bootstrap, so a log with entries
//	                          and no valid slot lost its HardState
//	raft/index/<first index>  preallocated mapped files of fixed 32 B units,
//	                          one per raft index (Unit): term, pos, len,
//	                          kind (DATA, EMPTY, CONF, CMD), flags (bit0: an
//	                          END_OF_FILE blank precedes the bytes), CRC-32C
//	                          of the payload and of the unit
//	raft/meta-log/<offset>    the payloads of CONF and CMD entries, appended
//	                          (their CRC-32C is in the unit)
//	raft/conf                 the membership the applied conf changes made,
//	                          by raft index, the peer addresses they named
//	                          and the removed ids (sealed JSON, replaced
//	                          atomically; conf.go); absent until a change
//	raft/base                 FirstIndex-1, its term, and the commitlog and
//	                          meta-log ends up to it, once compacted or
//	                          installed (sealed JSON; base.go)
//	raft/mark                 where a start's walk of the index may begin:
//	                          a synced entry, its term, unit CRC and the
//	                          two ends up to it (sealed JSON, written by
//	                          the store's checkpoint every MarkEvery
//	                          entries and at a clean close; mark.go)
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
// commitlog before it is in the raft log. The entries appended last stay
// in memory too (entryCache, Options.CacheBytes): raft reads each one back
// to apply it a Ready or two later, on every member, and those reads come
// from memory, not copied out of the commitlog.
//
// Per Ready the raft loop calls Append(rd.Entries) (truncating an
// uncommitted suffix first when the entries start at or below LastIndex,
// design §2.3), SetHardState(rd.HardState) when it is set, then Sync:
// one msync of the commitlog range, the meta-log's fsync, one msync of the
// index units, and the HardState slot, with its fdatasync only when the
// term or vote changed (raft's MustSync; design §3.2 step 4). Messages
// that acknowledge the entries go out only after Sync returned. So a
// Ready that carries entries costs two device flushes, not three: the
// commit index moves in nearly every Ready, and syncing it each time was
// a third flush in a row on the one disk (BENCHMARKS.md).
//
// Sync flushes without the Log's mutex held: raft's Step (a proposal, a
// follower's answer) reads the Log (FirstIndex, Term, Entries) under the
// replica's lock, and waited for every msync of the raft loop when Sync
// held the mutex throughout. Committed entries the replica synced in an
// earlier Ready are applied before the Ready's write (WriteHardState
// writes their commit first; SyncedIndex tells which): a PUT_OK does not
// wait for the flush of entries proposed after it. Nor for the flush in
// progress: the replica's raft loop runs Sync on another goroutine and,
// while it waits, applies what its followers' answers committed up to
// SyncedIndex (AdvanceCommit writes that commit first, never lowering
// one; a HardState left pending for the Sync keeps the higher commit).
//
// The commit on disk may therefore lag the commit raft acted on, by what
// a power cut takes back from the page cache (a kill -9 takes nothing).
// Raft allows it: the commit is relearned from the leader, and Applied at
// restart is the commit on disk. What the store persists beside the log
// must not run ahead of it: SyncCommit makes the commit written durable,
// and is called before a checkpoint records anything dispatched or
// applied (storage's groupCQLog.Sync and raftPoint) and before a Ready's
// commands or conf changes are applied (their effects are persisted with
// their raft index); compaction goes only as far as the commit on disk.
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
// offset) is a *CorruptionError and the replica refuses to start. Every
// unit from raft/mark on (from the first index kept without one) is
// checked (its CRC, term order, and where its payload lies against its
// neighbours'): a start after a clean close checks none, one after a
// crash about MarkEvery, not every retained unit (LastConf, the newest
// CONF entry, is known from the mark and the walk, so the raft loop's
// restart need not scan for conf entries either). A DATA payload is
// read only from where the commitlog's own recovery scan started
// (Options.Checked: the checkpoint's file), as §3.4 step 3 scans both
// from the checkpoint. Below it the files were sealed and synced before
// the checkpoint passed them; reading a field of each of their records
// made a start read every retained file (Options.Checked). Damage there
// is found by the reads that cross it (Entries checks each payload's CRC,
// client reads each record's), by `storaged check`, and mended by
// `storaged replica repair`.
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
// A raft/hardstate with no valid slot (or none at all) while the log
// holds entries, and a damaged raft/meta (or a missing one while the log
// holds entries), are *CorruptionErrors too, at Open and in CommitEnd
// (which the store reads first): a member back at term 0 could vote twice
// in one term, and one bootstrapped again would forget who it is.
//
// # Repair
//
// Repair (repair.go) is the offline way past such an error, from one or
// more peers (State and ReadRange serve them there):
//
//   - a damaged entry is fetched from the first peer that holds the same
//     entry by raft's Log Matching (an identical unit; or an identical unit
//     of a later entry this replica still holds; or committed on both
//     sides), its records checked, payload then unit rewritten in place,
//     synced;
//   - a damaged entry past the commit index that no peer holds is cut
//     (units kept in index/<i>.broken; the next start cuts the commitlog
//     bytes, keeping commitlog/<offset>.broken) only when the voters that
//     provably lack it (their log ends before it, or holds another entry
//     at it or below) leave fewer than a majority that could have held it,
//     this replica counted as a holder: with 3 voters both peers, with 5
//     three of the four; a joining peer proves nothing;
//   - a lost raft/hardstate is rebuilt: term = the highest of the peers'
//     terms and of the log's, vote = this member (no second vote in that
//     term), commit = the highest index held identically by a peer that
//     committed it, at least the checkpoint's applied index; it needs the
//     terms of enough voters that every majority including this member has
//     one that answered (why that is safe: rebuildHardState);
//   - a damaged raft/meta is rebuilt from a peer's with this member's id,
//     refused when a peer disagrees with this member's flags (group,
//     cluster, file size, members) or the log disagrees with its LogBase.
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
//   - hand out bytes of the mapping (retention may unmap a file: Entries
//     copies them out, or serves the heap payloads Append took, entryCache)
//     or bytes whose CRC fails;
//   - continue after a failed write: every error stops the Log and a
//     restart recovers (the sticky-error rule);
//   - import anything above it: the raft dependency stays in this package
//     (the storage facade and consumequeue never import raft).
//
// # Not built yet
//
// Repair of a member whose group changed its membership (raft/conf):
// refused; remove the member and add a new one instead.
//
// Snapshot returns the base (FirstIndex-1, its term, the membership
// recorded at it, no data: the sender builds the manifest; InstallSnapshot and
// InstallBase reset the log to a snapshot's base; CompactBelow is
// retention's compaction). Not built: dropping the meta-log's payloads
// below the base on a plain Compact, and repair of the bytes no unit
// covers (raft/base, the meta-log past the units).
package raftlog
