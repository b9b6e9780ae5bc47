// Package storage is storaged's message store: RocketMQ's CommitLog write
// path, byte-compatible with RocketMQ's stored message layout, on
// memory-mapped files.
//
// # Packages
//
// This package is the facade: Open and Close, the put path, reads, the
// topic table, Options, errors and statistics. It composes parts that each
// own one concept, its state and its lock, and never hold a pointer to the
// Store (the compiler enforces the layering: none imports this package):
//
//	storage/record        the RocketMQ record codec: encode (Spec), the one
//	                      field walker (Parse), Check, Decode, msgId, tags
//	                      code, Message/Batch/Property; stdlib only
//	storage/segment       fixed-size mapped files, their list, the allocator
//	                      that prepares and faults in the next file, and the
//	                      read guard that keeps a file mapped while read
//	storage/commitlog     placement: Append under the append lock (roll +
//	                      END_OF_FILE blank, bytes through an encode
//	                      callback), reads, Sync (flush.Syncer), Recover,
//	                      Scan, Cut, TruncateAfter
//	storage/consumequeue  the consume queues and their dispatcher, which
//	                      follows a watermark func (the durable end in sync
//	                      mode, the written end in async mode, the commit
//	                      index under replication), the checkpoint, long
//	                      polls, read-your-writes
//	storage/schedule      delayed delivery, through schedule.Host
//	storage/timers        timer messages (delivery at a time) and their
//	                      recall, through timers.Host (timer_messages.go)
//	storage/retention     file deletion and disk watermarks, through
//	                      retention.Host
//	storage/offsets       the consumer offset table, its apply rule and the
//	                      codec of its records (consumer_offsets.go,
//	                      applied through sysrecords.go's hook)
//	storage/txn           transactional half messages: the pending table,
//	                      its apply rule and the op record codec
//	                      (transactions.go, applied through sysrecords.go)
//	storage/pop           POP consumption state (cursors, messages in
//	                      flight, their deadline heaps), the codec of its
//	                      records and of receipt handles (pop.go)
//	storage/raftlog       for replication (issue 13): raft.Storage over the
//	                      commitlog plus a CRC'd index of raft entries,
//	                      HardState, truncation of the uncommitted suffix;
//	                      with storage/replica, the only packages that
//	                      import etcd-raft
//	storage/replica       group mode's raft node: the RawNode, the classic
//	                      Ready loop on one goroutine, the leader's tail,
//	                      readiness barrier and put waiters; peers see only
//	                      marshalled messages (Transport, StepPeer)
//	storage/vfs           the file-system seam (OS, MemFS with power cuts
//	                      and injected errors)
//	storage/internal/...  base (shared error values, clock, sealed files),
//	                      fault (transient write faults), hist
//	flush/                the flush policies (Async, GroupCommit)
//
// Sequencing (queue offsets and store time, sequence.go) is a step of its
// own, apart from placement: the commitlog's Append runs it in its admit
// and encode callbacks, under the append lock, so records are stamped in
// log order; a replicated leader can stamp them where it proposes instead.
// The broker role is a runtime check (SetRole).
//
// Every part with a goroutine has one shape: its constructor (New) prepares
// it and starts nothing, Start runs the goroutine, Stop ends it and waits
// for it (safe to call twice), Close releases its files; Open starts the
// parts in dependency order once recovery is done, and Close stops them in
// reverse. The one exception is the segment allocator, started by
// segment.NewList and stopped by List.Close, because a list is useless
// without it. Tests check with goleak that nothing outlives Close.
//
// # Files and offsets
//
// The commitlog lives in Options.Dir/commitlog as a queue of files of
// Options.FileSize bytes (default 1 GiB), each named by the commitlog offset
// of its first byte, zero-padded to 20 digits:
//
//	00000000000000000000  00000000001073741824  00000000002147483648 …
//
// A commitlog offset ("physical offset") is a position in the endless log:
// the file holding offset o is the one named o - o%FileSize, at position
// o%FileSize. Files are contiguous, preallocated with fallocate (so a full
// disk fails file creation instead of raising SIGBUS on a page fault), and
// prepared one ahead by a background allocator so a roll never creates a
// file under the append lock. The allocator hands a file over as soon as it is
// mapped and then faults it in for writing in 32 MiB chunks ahead of the
// writer (a first write to a page of a preallocated file costs a fault of
// ~15 µs); at Open it does the same for the rest of the last file.
//
// A queue offset is different: the index of a message within its
// topic-queue (0, 1, 2, …), assigned under the append lock and advanced only
// when the append succeeded.
//
// # Record layout
//
// Every message is one record, big-endian, exactly as RocketMQ stores it
// (MessageExtEncoder; readable by MessageDecoder and the Go client's
// primitive.DecodeMessage). Offsets below are for IPv4 hosts; an IPv6 host
// takes 20 bytes instead of 8 and shifts what follows.
//
//	+0   TOTALSIZE       int32   whole record, this field included
//	+4   MAGICCODE       int32   0xDAA320A7 (V1); 0xDAA320AB (V2: int16 topic length)
//	+8   BODYCRC         int32   CRC-32/IEEE(body) & 0x7FFFFFFF
//	+12  QUEUEID         int32
//	+16  FLAG            int32
//	+20  QUEUEOFFSET     int64   index in the topic-queue
//	+28  PHYSICALOFFSET  int64   this record's commitlog offset
//	+36  SYSFLAG         int32   0x1 compressed, 0xC tx type, 0x10/0x20 IPv6 hosts
//	+40  BORNTIMESTAMP   int64   producer ms
//	+48  BORNHOST        8|20    IP, int32 port
//	+56  STORETIMESTAMP  int64   ms, stamped inside the append lock
//	+64  STOREHOST       8|20    IP, int32 port
//	+72  RECONSUMETIMES  int32
//	+76  PREPARED TX OFF int64
//	+84  BODYLEN int32, BODY
//	     TOPICLEN int8 (V1) | int16 (V2), TOPIC
//	     PROPLEN int16, PROPERTIES  "key\x01value\x02…" then, on the
//	                                first record of a batch of two or more,
//	                                "__BATCH#\x01ccccccccccccc,bbbbbbbbbbbbb\x02"
//	                                then "__CRC32#\x01dddddddddd\x02"
//
// The last property is the whole-record CRC (RocketMQ enabledAppendPropCRC,
// on by default here): CRC-32/IEEE & 0x7FFFFFFF of every byte of the record
// before those 20 bytes, written as ten decimal digits, least significant
// first. With it, a flipped bit anywhere in a record is detected, not only
// in the body. The batch property (37 bytes) carries the batch's record
// count and total byte length (every record of the batch, this one
// included), each as 13 zero-padded decimal digits, most significant
// first; it is an ordinary property to RocketMQ's decoders, under the
// whole-record CRC, and counted in the first record's properties length
// (MaxPropertiesLength) and in the batch's size checks. Single messages
// and one-message batches do not carry it. A full file ends with an 8-byte blank record: int32 bytes
// left in the file, int32 0xCBD43194. A record is appended only if its
// length + 8 fits the space left; otherwise the blank is written and the
// record goes to the next file, so no record crosses a file and every full
// file ends with a blank.
//
// The offset msgId is hex(store IP ‖ int32 port ‖ int64 commitlog offset),
// 32 characters for IPv4.
//
// # Put path
//
// PutMessage and PutMessages follow RocketMQ's order: refuse when closed,
// slave or read-only (SERVICE_NOT_AVAILABLE); validate topic, body and
// properties (MESSAGE_ILLEGAL, PROPERTIES_SIZE_EXCEEDED); refuse when the
// append lock has been held longer than PageCacheBusyTimeout
// (OS_PAGE_CACHE_BUSY); divert delay-level messages to SCHEDULE_TOPIC_XXXX
// (queue = level-1, REAL_TOPIC/REAL_QID kept); then, under the append lock,
// re-stamp the store time (never going backwards) and assign the queue
// offset (sequencing), take or roll the last file, encode straight into
// the mapping (placement, storage/commitlog) and
// publish the new write position with an atomic store — once per batch,
// after all its records are copied, so no reader, flush or checkpoint ever
// sees part of a batch.
//
// # Durability contract
//
// FlushAsync (default): a put is acknowledged once its bytes are in the
// mapping (the page cache). A process crash loses nothing acknowledged;
// an OS crash or power cut loses what was written since the last sync of
// the commitlog. The async flusher syncs every FlushInterval (500 ms) once
// FlushLeastPages (4) pages are dirty, and the checkpoint syncs whatever is
// dirty every CheckpointInterval (1 s). So the loss window is about 500 ms
// under load and at most CheckpointInterval, 1 s, for a trickle (plus the
// sync's own duration); FlushThoroughInterval (10 s) only matters if
// CheckpointInterval is set above it.
//
// FlushSync: a put is acknowledged (PUT_OK) only after an msync(MS_SYNC)
// covering its last byte has returned. Concurrent puts share syncs (group
// commit). If no sync covers it within SyncFlushTimeout the answer is
// FLUSH_DISK_TIMEOUT: stored, not known durable. A put with WAIT=false does
// not wait.
//
// In both modes a failed msync is sticky: the store turns read-only and
// nothing is acknowledged after it. A sync-mode put waiting for that sync
// is answered UNKNOWN_ERROR wrapping ErrWriteFailed (appended, durability
// unknown: it may or may not survive a crash); every later put is refused
// with SERVICE_NOT_AVAILABLE wrapping ErrWriteFailed. Only a restart, which
// recovers from what is on disk, clears it. Every other I/O error (the
// checkpoint, a consume queue, the delay progress, the topic table) is
// transient: retried with backoff, puts refused (SERVICE_NOT_AVAILABLE,
// ErrWriteRetrying) only while it lasts.
//
// # Recovery
//
// Open starts from the checkpoint (config/checkpoint: the flushed offset,
// below which every byte was durable, and the dispatched offset, below
// which every consume-queue entry was). It scans the commitlog from the
// lower of the dispatched offset and the start of the file holding the
// flushed offset, checks every record (magic, lengths, body CRC,
// whole-record CRC, PHYSICALOFFSET equal to where it lies) and stops at the
// first bad one. Where it stops decides:
//
//   - below the flushed offset, the damaged bytes were acknowledged as
//     durable: Open refuses with a *CorruptionError naming the file and
//     offset (never truncating acknowledged data by itself); storaged
//     check reports it, storaged repair --truncate-at cuts there offline;
//   - at or past it, it is a torn tail: the bytes from there to the last
//     non-zero byte are kept in commitlog/<offset>.broken for post-mortem,
//     the rest of the file is zeroed so stale bytes can never look valid
//     again, and later files are deleted (also kept as .broken when not
//     zero).
//
// Proving the tail past the end zero reads it all, up to a whole file (1
// GiB by default) through the mapping, from the disk after a reboot. It
// is skipped after a clean close: the abort marker (abort.go) is written
// at Open's start, before anything can write to the log, and removed only
// by a Close whose final sync and checkpoint succeeded, so its absence
// means the last run wrote nothing past its end. Then only the page
// holding the end is read (the scan has just faulted it in), and anything
// non-zero there gets the whole check anyway. The "commitlog recovered"
// line says which it was (tail_trusted).
//
// What survived is synced, the consume queues are cut to the checkpoint's
// counts and re-dispatched from its dispatched offset, and the sequencer's
// queue offsets are rebuilt from them.
//
// Batches are all or nothing across a crash: from a record carrying
// __BATCH#, the scan counts the batch only when every record of its
// declared extent is valid, none starts another batch, the last ends
// exactly at the extent's end and their number is the declared count.
// Otherwise (a kill -9 in the middle of the batch's copy into the page
// cache, or a power cut that kept only some of its sectors) the scan stops
// at the batch's first record and the whole batch is cut as a torn tail.
// The checkpoint's offsets never fall inside a batch (they are values of
// the write position), so a torn batch is either wholly past the flushed
// offset (cut) or wholly below it (a CorruptionError). An acknowledged
// batch is never torn: sync mode answers only once all of it is durable,
// and a kill -9 keeps everything copied before the answer.
//
// A checkpoint file that fails its checks refuses the open with a
// *CheckpointError naming it; RebuildCheckpoint (storaged repair
// --rebuild-checkpoint) writes a new one after a full check.
//
// # Consume queues and visibility
//
// A dispatcher goroutine (storage/consumequeue, RocketMQ's ReputMessageService)
// follows the commitlog and appends a 20-byte entry per message to its
// topic-queue's consume queue; reads and pulls go through those entries,
// so a message is readable once dispatched. It dispatches up to the
// written offset in async mode and only up to the flushed offset in sync
// mode (a consumer never sees a message a power cut could take back).
//
// Read your writes (consumequeue/visible.go): a put with WAIT (the default) is indexed
// before it is answered. Once its record is appended (async) or durable
// (sync) the putter dispatches up to the visible end itself when no round
// is running, or waits for the running round to end and looks again; it
// never pays the dispatcher's wake-up or pause. A put with WAIT=false wakes
// the dispatcher instead, which, after a round that found work, waits 1 ms
// before the next, so under a stream of such puts a message becomes
// readable within about a millisecond and records are indexed in batches.
// A failed or slow round (beyond SyncFlushTimeout) does not hold the
// answer: the message is stored, the answer is PUT_OK.
//
// Long polls (consumequeue/notify.go) register on their topic-queue and are woken only
// by rounds that advanced it; a filtered poll goes on from where its scan
// stopped. A pull reads at most MaxPullScan entries and answers with the
// offset past them. An entry that disagrees with its record (size, tags
// code) is ErrCorrupt, also when a tag filter skips it: for those the
// record's header is parsed in place, without the CRC.
//
// A consume queue (consumequeue/queue.go) keeps RocketMQ's layout:
// consumequeue/<topic>/<queue>/<20-digit byte offset>, 20-byte entries
// (int64 commitlog offset, int32 size, int64 tags code), file k holding
// entries [k*E, (k+1)*E) for E = ConsumeQueueEntries. Unlike the
// commitlog, its files are neither preallocated nor mapped: they grow by
// pwrite as entries arrive (vfs.File), so a queue of one message costs 20
// bytes of file (one disk block plus its directories, about 12 KiB on
// ext4, not 6,000,000 bytes), a full disk is an error from the write
// (never a SIGBUS), and no queue holds a mapping. Open files are a
// store-wide LRU cache bounded by MaxOpenQueueFiles (a file in use is not
// closed). The last block of 128 entries of a queue stays in memory and
// older ones are read a block per pread, so a pull of N entries costs
// N/128 reads. A round's entries are published at its end from that
// in-memory tail, before they are in their file: they are written when
// the tail moves on to the next block (one write per 128 entries of a busy
// queue, not one per round) and before every checkpoint, so a put that
// reads its write (WAIT) makes no write syscall for its index entry. A
// write that fails (ENOSPC, EMFILE) keeps the entries in the tail, still
// readable, and is retried as a consume-queue fault (puts are refused
// meanwhile, as for any failing background write); a queue whose tail is
// full stops the round at the entry that does not fit, and the next round
// takes it. Nothing on the dispatch path syncs: creating a queue is a
// mkdir and an open. The checkpoint writes the pending entries, then makes
// the files written and the directories created since the last one
// durable (16 syncs at a time) before it records the queues' counts. A restart opens nothing to
// find a queue's end: the files' sizes give its count, capped at the
// checkpoint's (entries past it are written again from the commitlog),
// then one block read from the end cuts entries pointing past the
// commitlog end; only a queue shorter than the checkpoint says (damage) is
// scanned forward. A rebuild of the queues from the log (a queue missing
// or short) checks every record's CRC first, since recovery scanned only
// from the checkpoint's file: damage there is a CorruptionError, and
// record.Parse checks every length, so no damaged byte panics.
//
// # Delayed delivery and retention
//
// A goroutine delivers delay-level messages (storage/schedule): when a
// SCHEDULE_TOPIC_XXXX entry's delivery time comes on Options.Clock, the
// message is put again to REAL_TOPIC/REAL_QID without its delay properties.
// Progress per level lives in config/delayOffset.json, written only after
// the re-puts it covers are durable: at least once, never early, never
// lost. Another (storage/retention) deletes commitlog files older than
// FileReservedTime at DeleteWhen, or at once above DiskCleanPercent, trims
// the consume queues to match (reads below get ErrOutOfRange), and refuses
// puts (ErrNotWritable + ErrDiskFull) while the disk is above
// DiskWarningPercent. Both wait on the clock through TimerClock when it has
// one, so tests with a fake clock never sleep.
//
// # Timer messages
//
// A message with TIMER_DELIVER_MS, TIMER_DELAY_SEC or TIMER_DELAY_MS and no
// delay level (RocketMQ 5's TimerMessageStore; timer_messages.go) due
// after the clock is diverted in prepare to rmq_sys_wheel_timer queue 0
// with TIMER_OUT_MS (its delivery time) and REAL_TOPIC/REAL_QID; a time not
// in the future is stored as it is; one more than Options.TimerMaxDelay
// ahead, or a value that is not an integer, is WHEEL_TIMER_MSG_ILLEGAL; a
// put while Options.MaxTimerMessages are pending is WHEEL_TIMER_FLOW_CONTROL
// (ErrTimerFull). The dispatcher writes the delivery time as the entry's
// tags code. storage/timers keeps the pending ones in a B-tree by (delivery
// time, commitlog offset), bounded by MaxTimerMessages, and its goroutine
// puts each back to its topic (Redeliver, as the scheduler) once the clock
// reads its time. RecallTimer appends a recall record (TIMER_DEL_UNIQKEY)
// to the same queue and waits for it to be durable (committed) before it
// takes the message out. The progress (oldest pending queue offset, and
// the smallest pending key among the entries read) is config/
// timerProgress.json, written once the re-puts it covers are durable, or in
// a group a CMD entry (delaycmd.go) the ready leader proposes; Open, or a
// new leadership, rebuilds the index from the timer queue from that point,
// applying recall records: at least once, never early, never lost. Retention
// keeps the files from the oldest timer record the persisted progress (in a
// group, on every replica, the replicated one) has not resolved.
//
// # Topics
//
// Every topic has a queue count (topics.go, RocketMQ TopicConfigManager),
// kept in config/topics.json, replaced atomically like the checkpoint. A
// put names a queue id below it; a put to an unknown topic creates it
// (Options.DefaultQueues) unless Options.NoAutoCreateTopics; at most
// Options.MaxTopics exist, each with at most MaxQueues queues. Clients
// cannot write RocketMQ's reserved topics (topicrules.go), among them
// SCHEDULE_TOPIC_XXXX, which only the delay diversion writes; the
// scheduler serves the delay table's levels and nothing sized by a queue
// id read from disk. DeleteTopic leaves a tombstone (the commitlog offset
// of the delete) that the dispatcher honours, so no rebuild resurrects a
// deleted topic's records. It also clears the topic's consumer state
// (topicclear.go): the consumer groups' committed offsets and POP cursors
// and messages in flight of its queues, dropped when the delete is
// published and skipped by every later application of an older offset or
// POP record (live, at Open's replay, in a snapshot's records), so a
// re-created topic is consumed from offset 0. The groups' retry and
// dead-letter topics, pending transaction halves and the idempotent-put
// window are left alone.
//
// # Replication (group mode, storage layer)
//
// With Options.Group set the store is one replica of a raft group whose
// log is its commitlog (design replication.md, Option A; group.go,
// storage/replica, storage/raftlog). It needs FlushMode sync and Role
// master (Validate refuses the others: an async replica could forget an
// entry it acknowledged and elect a leader without it).
//
//   - Put path (§3.1): validation and encoding as standalone; then, under
//     the raft node's lock, on the ready leader only, the records are
//     stamped (queue offsets from the leader's table, PHYSICALOFFSET from
//     its tail with the roll rule, store time max(now, last)); the puts
//     stamped until the raft loop's next round are proposed together as
//     one entry (a batch is one put), at most what one append carries
//     and never across a commitlog file's end. The put waits for its entry:
//     PUT_OK once it commits (on a majority, each member synced its
//     commitlog range and raft index before acknowledging); a
//     *NotLeaderError (cause SUPERSEDED, nothing stored) once the commit
//     passes its position with another entry or reaches an entry of a
//     later term (the next leader's first); FLUSH_SLAVE_TIMEOUT with
//     ErrReplicationTimeout (outcome unknown) after
//     GroupOptions.ReplicationTimeout. WAIT=false waits too.
//   - Refusals, nothing stored: a follower, no leader, a leader not yet
//     ready or transferring return a *NotLeaderError (ErrNotLeader; cause,
//     leader id, term); too few recently active followers,
//     IN_SYNC_REPLICAS_NOT_ENOUGH (ErrInSyncReplicasNotEnough); an entry
//     raft drops (its bound on uncommitted bytes), OS_PAGE_CACHE_BUSY for
//     each put in it, their stamps undone.
//   - Raft loop (§3.2, storage/replica): one goroutine started by Open and
//     stopped by Close; per Ready the leader sends before its own write,
//     applies the committed entries it synced in an earlier Ready, then
//     raftlog Append (truncating an uncommitted suffix), HardState, one
//     Sync (the commit rides along unsynced: raftlog's hardstate.go); a
//     follower sends after. Committed DATA entries move the
//     commit end (the store learns it first: Committed), then answer
//     their waiters, so a PUT_OK is indexed once AwaitDispatched returns
//     (it used to be answered before the store knew the new commit end:
//     the index wait then gave up at once, and a read right after a PUT_OK
//     could miss it). A new leader takes puts only after it
//     applied its own term's first entry, then indexes everything
//     committed and resets its stamping table from the consume queues.
//     Ticks come from GroupOptions.Ticks (tests) or a ticker.
//   - Visibility (§3.3): reads and the dispatcher stop at the commit end on
//     every replica; followers index committed entries and serve reads
//     (not linearizable: an absent answer can be stale). A pull,
//     QueueInfo, GetOffset or GetOffsetByTime first indexes up to the
//     commit end it sees (catchUp in read.go), so it covers the commit
//     point GetReplicaInfo reported before it, also the entries whose
//     putters went away.
//   - Linearizable reads (§3.3): Store.ReadBarrier, then any read. Only
//     the ready leader passes it: it registers with the raft loop, which
//     gives all the readers registered since its last pass one raft
//     ReadIndex (ReadOnlySafe: a heartbeat round of its term acknowledged
//     by a quorum, after the reads began), matches the Ready's ReadStates
//     by request context, and answers each batch once the applied index
//     reaches its read index, with the commit end (before the Sync of the
//     Ready that carries the ReadStates: the round owes nothing to it;
//     followers answer heartbeats before their own Sync too, as
//     etcd-raft's asynchronous-write mode does); the barrier then waits
//     for the consume queues to cover that end. With
//     GroupOptions.FollowerReads a follower or learner that knows the
//     leader passes it too: its ReadIndex goes to the leader (raft's
//     MsgReadIndex, sent before the Sync, as is the answer), which
//     confirms it with the same heartbeat round and answers its commit
//     index; the follower answers the batch once it applied that far.
//     Request contexts are the member's id and the batch's number: the
//     leader drops a request whose context it holds already. Refusals
//     (nothing read, a
//     retry is safe): the put's *NotLeaderError on a follower, a learner
//     (without FollowerReads),
//     without a leader, on a leader not ready, and for every waiting read
//     when the leader loses its leadership (raft forgets its pending
//     requests; a follower's waiting reads when its leader changes);
//     ErrReadIndexTimeout after ReplicationTimeout (a leader cut
//     off from its quorum never answers with a stale state);
//     ErrReadIndexBusy beyond GroupOptions.MaxReadWaiters (4096). Standalone
//     the barrier passes at once: a PUT_OK is indexed before it is
//     answered, and nobody else writes.
//   - Recovery (§3.4): Open reads the raft log's commit end before it
//     recovers the commitlog (damage below it is corruption, never a torn
//     tail), opens the raft log (which reconciles its index), rebuilds the
//     consume queues to the commit end and restarts raft with Applied =
//     the commit index (the queues are rebuilt to exactly that index).
//     The checkpoint's flushed offset is the commit end (at most
//     raftlog.DurableEnd): never truncated, unlike the durable but
//     uncommitted suffix a new leader may cut. The checkpoint also records
//     the raft point it reflects (§3.6, consumequeue.RaftPoint: applied
//     index and term, commit end, log end; dispatched ≤ commit end), and
//     Open refuses, as a *CorruptionError, a raft log that no longer holds
//     that applied index or holds another term there (a raft directory
//     restored from elsewhere, or one that lost entries this member
//     applied: its queues and state were built from entries the log
//     lacks). Past the commit
//     end a replica may have acknowledged entries too, so there the
//     commitlog is recovered with commitlog.RecoverGroup: a bad record a
//     raft unit vouches for (raftlog.SyncedData) is cut only when torn (an
//     all-zero 512 B sector, etcd's isTornEntry rule), and the raft log
//     cuts a bad unit only when it is the last one; other damage is a
//     *CorruptionError naming file and offset.
//   - Repair (§3.4): RepairReplica, offline, fetches the damaged entries
//     from the first of its peers that holds them (the server's FetchRange
//     peer RPC, which reads ReadRaftRange), takes them only when raft's
//     Log Matching makes them the same entries, checks every record,
//     rewrites them in place (raftlog.Repair); cuts a damaged uncommitted
//     entry only when the voters that provably lack it leave no majority
//     that could have committed it; rebuilds a lost raft/hardstate and a
//     damaged raft/meta from the peers' (FetchState, ReplicaState). Once
//     raft/conf records a membership change, raft/meta's voters are not
//     the group's: the cut and the two rebuilds (which count voters) are
//     refused then, the damaged entries still taken from a peer. The
//     cmd is `storaged replica repair --from`.
//   - An empty data dir (issue 14): a member bootstrapped empty is joining
//     (raft/joining) until it holds entries and applied up to the highest
//     commit a leader told it; meanwhile it withholds its vote from
//     candidates with a log (it may have acknowledged entries they lack).
//     A leader whose follower rejects below its match (a wiped member)
//     hands leadership on, so a fresh leader catches it up from index 1; a
//     member whose leader counts entries past its log (a rolled-back dir)
//     stops with ErrLostEntries.
//   - Peers: Transport.Send (non-blocking, may drop), Store.StepPeer,
//     ReportUnreachable, PeerGone, ReplicaInfo; the gRPC transport is the
//     server's. PeerGone (the transport's stream to a member ended and it
//     went silent while two attempts failed: its process died) makes a
//     follower of that leader forget it and the survivors campaign at
//     once, a tick apart by id, instead of after the election timeout;
//     pre-votes keep a wrong report from deposing a live leader
//     (replica's leaderdown.go).
//
// Retention and snapshots (§3.5). Retention is time-based per replica
// (FileReservedTime and DeleteWhen as standalone). Before it deletes
// files a replica compacts its raft log past the entries whose bytes they
// hold (retention.Host.BeforeDelete → raftlog.CompactBelow: FirstIndex
// moves up, raft/base records it); on the leader it also keeps what its
// slowest follower still needs from the log, at most
// GroupOptions.CatchUpWindow bytes below the commit end
// (--raft-catchup-window, default 4 GiB; bytes because retention deletes
// files and catching up from the log costs cold reads on the raft
// goroutine per byte: raft's Entries calls copy them under the node's
// lock, where puts wait; each is timed, storaged_raft_storage_entries_seconds).
// With GroupOptions.CatchUpReadahead set (--raft-catchup-readahead; off
// by default: no gain measured on our VM), the leader reads ahead of a
// follower that is far behind: once per round of the raft loop it looks
// at each follower's progress, and when the entries from its Next on
// start more than half of the readahead below the data end, a prefetcher
// goroutine asks the kernel (MADV_WILLNEED, commitlog.Log.WillNeed) for
// that much from there, and again once the follower has used half of it;
// the reads raft then makes find the pages in memory. A follower that
// keeps up reads what was just written and costs a look at its progress.
// A follower behind FirstIndex gets raft's MsgSnap, a file transfer
// (group_snapshot.go): it leaves the raft loop through
// Host.SendSnapshot, the manifest is taken at the leader's applied index
// (files with CRC-32C, commit end, newest store time, per-queue first
// offsets) and the transport's SendSnapshot streams it and the files,
// which retention does not delete meanwhile. The receiver
// (Store.ReceiveSnapshot) checks the MsgSnap against itself, stages the
// files in <data dir>/snapshot.tmp and verifies every chunk and record
// (storage/snapshot; server/peer's InstallSnapshot), then steps the
// MsgSnap into raft (replica.Node.StepSnapshot; StepPeer refuses a MsgSnap
// without its files). The raft loop installs what raft restored before
// anything after it (group_install.go): under a journal
// (snapshot.install), the staged files renamed into the commitlog and the
// others deleted (commitlog.Log.Install), the raft log reset to a base at
// the snapshot's index (raftlog.InstallBase: HardState commit ≥ S,
// raft/base, meta-log emptied, index files gone), the consume queues
// moved onto the new files (consumequeue.Jump: a queue whose messages the
// leader deleted starts at the manifest's first offset with RocketMQ's
// fill-pre-blank), a checkpoint, then the journal removed. Open finishes
// an install whose journal it finds (rollForwardInstall) and removes a
// staging dir without one, so a crash leaves the old state or the
// installed one. Readers stop at the commit end throughout: it moves to
// the snapshot's end only once the queues point at the new files, and the
// bytes below the old commit end are the same in both. The manifest
// carries the topic table (its commands are compacted away with the log;
// topicTable.applySnapshot) and the delivery progress: the delay and
// timer progress the sender applied, with the raft index of each command
// that set it (snapshot.Manifest.Delay, Timer). The install applies it and
// writes it to config/groupProgress.json (group_progress.go), which
// retention also writes before each compaction; Open reads that file,
// then the progress commands still in the log. So a member that installed
// a snapshot, or whose log was compacted, and then leads repeats only the
// deliveries after the last progress command, as §3.5 allows.
//
// Delay progress is replicated (§3.5): only the ready leader's scheduler
// delivers (its re-puts go through the propose path and wait for their
// commit); after each round that delivered it proposes a CMD entry
// {level → next queue offset} (delaycmd.go; raftlog keeps it in its
// meta-log), which the log places after the re-puts it covers. Every
// replica applies it (Host.ApplyCmd → Store.DelayProgress) and recovers
// it at Open from the last such entry at or below the commit index
// (raftlog.LastCmd: raft never hands those back). A scheduler that sees a
// new leadership (schedule.Host.Epoch = the term its replica became the
// ready leader in) resumes from the replicated progress before it
// delivers, and a progress command is proposed only in the leadership it
// was computed in (replica.ProposeCmd refuses another term's): a
// failover repeats at most the deliveries since the last committed
// command (≤ 256 per level, one round), never drops one.
// The timer service's progress is replicated the same way (a
// cmdTimerProgress command; Store.TimerProgress), and a replica that
// becomes the ready leader rebuilds its due index from the last committed
// one before it delivers or answers a recall; recall records are
// replicated like any put.
// config/delayOffset.json stays as a local cache the leader no longer
// trusts; retention's undelivered-delay protection reads the replicated
// progress on every replica (hosts.go schedProtectedFrom; a follower's own
// cache never moves, and would keep every delayed message's file). A group that delivered before
// this (no command in its log) redelivers its schedule queues once.
//
// Consumer offsets are replicated as system records (below): a commit is
// proposed on the ready leader and acknowledged once committed, every
// replica applies it as it commits, and GetOffset on a follower serves
// its applied table (ReadBarrier first for a linearizable answer).
//
// Topic creates and raises are replicated (grouptopics.go): CreateTopic,
// UpdateTopic and a put's auto-create are proposed on the ready leader as
// CMD entries, applied by every replica in log order (the count becomes
// max(current, asked), so racing changes commute) and answered once the
// leader applied them; a follower refuses them (*NotLeaderError).
// config/topics.json records the raft index of the last command it holds
// and Open replays the committed ones after it (raftlog.Cmds).
//
// Topic deletes are replicated the same way (cmdTopicDelete): the ready
// leader blocks puts to the topic from the proposal to the apply, every
// replica applies the delete in log order before its batch's commit end
// is published, tombstoning the topic at the commitlog offset past the
// last DATA entry before the command (the same everywhere) and dropping
// its queues with the dispatcher paused; Open replays topic commands
// before it rebuilds the queues. A snapshot carries the table, its
// tombstones and the index of the last topic command they reflect; the
// install drops the queues of topics deleted while the member was behind.
// The delete clears the topic's consumer offsets and POP state at the same
// point on every replica (topicclear.go); the leader lets the offset
// commits and POP changes under way land before the proposal and refuses
// or skips the topic's after it until the delete applied.
//
// A topic created before topic commands existed (a data dir of an older
// version) is known only where it was created or adopted from the consume
// queues at Open; the offset calls take a queue a replica has indexed as
// existing.
//
// Membership changes (group_members.go; replica/membership.go; raftlog's
// conf.go): AddLearner, PromoteLearner and RemoveMember on the ready
// leader propose one simple raft conf change each (one voter changed at
// most: no joint configuration), one at a time, and return once applied.
// The rules: a new member joins empty (GroupOptions.Join: no bootstrap
// membership; it learns it from the leader's log or snapshot) as a
// learner with a new id (ids are never reused: raft/conf records the
// removed ones, and a removed member's data dir refuses to start); it is
// promoted only once heard from within an election timeout and at most
// replica.MaxPromoteLag entries behind the commit; no voter is removed
// whose removal would leave too few active voters for a quorum. A leader
// removes itself in two steps: it hands its leadership to the most
// caught-up active voter (as TransferLeadership does), then sends the new
// leader a request for its removal (a raft MsgProp carrying the change,
// the only proposal a member takes from a peer), resent until it applies
// the removal or its caller gives up; the group is never without a leader
// for an election timeout, and the puts the old leader proposed are
// committed by the new one. Every member applies a
// committed change in log order: raft's configuration, then raft/conf
// (the membership at the change's index, the peer address the change
// carries for a member it adds, the removed ids), synced, before any
// entry after it applies; the commit is synced before the change applies,
// so a crash in between restarts raft with the membership recorded at or
// below the commit and replays the conf entries above it (raft hands no
// entry at or below Applied back). A snapshot carries the membership at
// its index (raft's metadata, which the sender reads with its applied
// index) and the addresses and removals (the manifest); the receiver
// records them before its install journal, so a restart that finishes the
// install finds them. GroupOptions.OnMembership tells the process of each
// change (storaged's transport adds and drops peers there). A removed
// member that learns its removal stops replicating and refuses puts
// (cause REMOVED); it may never learn it (the leader stops sending to it
// once it applied the removal), which is harmless: the others drop its
// messages. A member that missed changes (down or cut off while they
// applied) may find the leader is a member it has never heard of: it
// steps a leader's appends, heartbeats and snapshot, and a candidate's
// vote requests, from any id raft/conf does not record as removed
// (replica.Node.strangerMayLocked; the rest only from members), and the
// transport answers such a sender at the peer address its batches name
// (server/peer's strangers), so the member catches up with the changes
// it missed instead of campaigning alone, and can help elect a leader it
// has not heard of.
// Once raft/conf records a change, raft/meta's bootstrap membership and
// cluster id are no longer checked against the flags.
//
// Leadership hand-overs (replica.go's handOverLocked) have three callers
// that share one shape: TransferLeadership (a stopping process: puts stay
// refused for good, replica's stopping), a leader's removal of itself,
// and MoveLeadership (an operator's move to a voter it names, or the most
// caught-up active one; storaged replica transfer). Each refuses puts
// with TRANSFERRING while it runs, asks raft to transfer, asks again at
// each tick once raft gave the transfer up (a transferee with a committed
// conf change still to apply refuses raft's MsgTimeoutNow: a move right
// after a promotion), and waits for another member to lead. A move or a
// removal that gives up (two election timeouts, or its ctx) aborts raft's
// transfer and takes puts again while it leads in the same term, unless
// the process began stopping meanwhile. A move is refused, nothing
// changed, on a follower (NotLeaderError), while the leadership moves
// already (TRANSFERRING), while a conf change has not applied
// (ErrConfChangePending; a conf change is refused TRANSFERRING while a
// move runs), for an id that is no voter (ErrNotVoter) or a voter not
// heard from within an election timeout (ErrTransfereeInactive).
//
// Idempotent puts (idempotent.go): the ready leader keeps the dedup
// window and remembers a key once its put's entry commits, whatever the
// put answered: a put that stopped waiting first (FLUSH_SLAVE_TIMEOUT,
// ctx) hands its ticket to the entry's waiter (entryFate, replica
// Node.Then), so the key stays pending, and a retry waits, until raft
// commits the entry (remembered) or supersedes it (freed). Every other member keeps its window up
// to the commit as commits arrive (groupdedup.go, trackDedup: the keyed
// records newly committed; the whole window read from the committed log
// once after it starts or stops leading, on a goroutine beside the raft
// loop, which goes on meanwhile), and a member that becomes the ready
// leader reads only what lies past it (readyDedup; a leader whose whole
// read runs still is not ready until it ends), so a retry after a
// failover is answered with the first put's result without the new
// leader reading its log's tail before it takes puts. Followers refuse
// keyed puts as any put.
//
// # System records
//
// State the store keeps for itself lives in records of system topics in
// the commitlog (sysrecords.go), so recovery and replication carry it
// with nothing of its own. Such state changes only through one hook:
// consumequeue.Options.Apply names an applier per system topic, and the
// dispatcher hands it each record of that topic as it indexes it, once,
// in log order (Index.StartApplyingPaused; a record indexed again after a
// failed round is not handed again). Indexing stops at the visible end,
// so the state follows what is committed in a group (never an
// uncommitted entry, which a new leader may truncate), what is durable in
// sync mode, what is written in async mode; every replica holds the same
// state at the same log position. A write of such state is a put of one
// record (putSystem: on the ready leader in a group, answered once
// committed and indexed), never applied where it is written. Open
// rebuilds the state by replaying the topic's consume queue
// (replaySystem), then starts the hook (openSystemState; a snapshot
// install that replaces the log calls it again). Appliers are quick,
// never call back into the index, never refuse a record that decodes,
// and read nothing but their records and the state those built (not the
// clock, the topic table or the role), or replicas drift apart. Consumer
// offsets and transactional half messages use it; POP checkpoints and
// acks are meant to be the next.
//
// # Consumer offsets
//
// Committed offsets per (consumer group, topic, queue) are records of the
// system topic RMQ_SYS_CONSUMER_OFFSET (consumer_offsets.go, table and
// record codec in storage/offsets): CommitOffset writes one (putSystem;
// durable as an acknowledged put, committed on a majority in a group) and
// the table applies it when it is indexed; Open rebuilds the table by
// replaying that topic's consume queue with the same rule, from the
// table's last snapshot on (offsets_snapshot.go: config/consumerOffsets.snap,
// a cache used only while the log still holds the synced record it names,
// written at Close and every max(65,536, keys) records; state_snapshot.go
// has the rules). Retention,
// before it deletes a file, writes again the latest value of every key
// whose record lies in it (DeletableEnd; a rewrite record names the record
// it copies, and never overwrites a newer commit), keeping the file when
// it cannot (in a group only the ready leader rewrites; the others keep
// the files until its rewrite is applied). Clients can neither put to
// that topic nor read it (HiddenTopic). GetOffsetByTime binary-searches a
// queue by store time.
//
// # Transactional messages
//
// RocketMQ's two-phase send (transactions.go, storage/txn). A PREPARED put
// is a half message: diverted in prepare to RMQ_SYS_TRANS_HALF_TOPIC queue
// 0 with REAL_TOPIC/REAL_QID and TRAN_MSG=true, its transaction type reset
// to NOT (RocketMQ's parseHalfMessageInner), so it is indexed on the half
// topic, which no client reads, and never on its own; its commitlog offset
// names the transaction. The table of pending halves is system state: the
// half topic's records add to it, the records of RMQ_SYS_TRANS_OP_HALF_TOPIC
// (TAGS "d" with TRAN_OP_RESOLUTION COMMIT, ROLLBACK or DISCARD; TAGS "c" for
// a check; the body the half queue offsets, comma separated) take from it
// or count checks, on every replica through the hook, and Open replays
// both topics from the table's last snapshot on (txn_snapshot.go:
// config/transactions.snap, the pending halves and the ends remembered as
// the last half and op records applied left them, both records checked
// against the log; the rules of state_snapshot.go). EndTransaction commits by putting the message to its queue
// (COMMIT type, PREPARED TX OFF = the half's offset, TRAN_MSG, REAL_TOPIC
// and REAL_QID cleared, TRAN_PREPARED_QUEUE_OFFSET set) and then its op;
// a rollback writes the op only; ends are idempotent. A crash between the
// put and its op leaves a half whose message is delivered: the store that
// runs ends (standalone after Open, a group's ready leader per leadership)
// first reconciles, reading the half's queue after the half for a COMMIT
// record naming it, and only writes the missing op for those: never lost,
// delivered at most once. A check goroutine (Open starts it, Close stops
// it; a master, a group's ready leader; Options.Clock; idle without a
// pending half) asks the TransactionChecker about halves older than their
// immunity (CHECK_IMMUNITY_TIME_IN_SECONDS or TransactionTimeout) once
// every TransactionCheckInterval, counting each check in a "c" op, and
// discards a half after TransactionCheckMax checks. MaxPendingTransactions
// bounds the table (ErrTransactionsFull); retention keeps the files from
// the oldest pending half.
//
// # POP consumption
//
// RocketMQ 5's SimpleConsumer model (pop.go; table and codecs in
// storage/pop). The state is, per (group, topic, queue), the next offset
// to pop, and per message in flight its invisible deadline and a
// generation; it lives only in the records of the system topic
// RMQ_SYS_POP_STATE (queue 0), appended through the put path under the
// table's lock, and is rebuilt at Open by replaying them in log order,
// from the table's last snapshot on (pop_snapshot.go: config/popState.snap,
// under the rules of state_snapshot.go, as the consumer offsets'). A
// record body (big-endian, storage/pop's Encode) is
//
//	u8 version (1; 2 with an item redelivered in place) | u16 ops | ops × {
//	u8 kind (1 Set, 2 Drop) | u8 len, group | u8 len, topic | i32 queue |
//	i64 cursor (-1: unchanged) | u16 items | items × { i64 queue offset,
//	i64 deadline (Unix ms), u64 generation, version 2: u32 redelivered } }
//
// Set moves the cursor and puts items in flight (a receive; a change of
// invisible duration with a new generation; a restatement before
// retention); Drop takes items out when their generation matches (an ack;
// a message moved to %RETRY%<group> or %DLQ%<group>). A receive, ack or
// change answers once its record is durable (sync; written, async), so a
// restart neither loses an ack nor forgets a message handed out. A receipt
// handle is base64url of { u8 version 1, u8 flags (bit 0: from the retry
// topic), i32 queue, i64 queue offset, u64 generation, u32 CRC-32C }: a
// damaged handle fails its check, one of an earlier delivery its
// generation. Redelivery copies the message to %RETRY%<group> (reconsume
// times + 1, RETRY_TOPIC and ORIGIN_MESSAGE_ID set) before the original's
// Drop, in that log order (a crash between them delivers twice, never
// loses); past the group's max attempts the copy goes to %DLQ%<group>.
// Due messages are moved by the group's next receive (at most 64 a call).
// A FIFO receive (PopRequest.Fifo) pops no queue while the group has one
// of its messages in flight, and delivers a due message again in place
// (a Set of the same offset carrying Redelivered + 1: version 2 records,
// written only then) instead of copying it to %RETRY%<group>.
// Memory: one map entry and heap slot per message in flight, bounded in
// all and per group (Options.MaxPopInflight, MaxPopInflightPerGroup), and
// one cursor per popped queue (MaxConsumerOffsets); every operation is
// O(log n) in the group's messages in flight, never a scan of the log.
// Retention restates the live state whose record lies in a file about to
// go (rewritePop), as for offsets. In a group the records are system
// records (sysrecords.go): proposed on the ready leader, answered once
// committed and applied, applied by every replica as they commit, so a
// new leader holds the in-flight table and takes the old leader's receipt
// handles; followers refuse POP calls (*NotLeaderError); a group's changes
// are serialized (one raft round each); a snapshot installed over a gap
// rebuilds the table from the snapshot's records; retention's restating
// of live state is proposed by the ready leader, excluding every other
// POP change meanwhile (pop.go rewritePopGroup).
package storage
