package storage

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/storaged/storaged/flush"
	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/retention"
	"github.com/storaged/storaged/storage/schedule"
	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/timers"
	"github.com/storaged/storaged/storage/vfs"
)

// FlushMode selects when a put is acknowledged relative to the disk.
type FlushMode uint8

const (
	// FlushAsync acknowledges once the record is in the mapped file (the page
	// cache); a background flush makes it durable within FlushInterval under
	// load, and the checkpoint's sync within CheckpointInterval for a trickle
	// (FlushThoroughInterval if that is shorter). RocketMQ ASYNC_FLUSH.
	FlushAsync FlushMode = iota
	// FlushSync acknowledges only after an msync covering the record has
	// returned (group commit). RocketMQ SYNC_FLUSH.
	FlushSync
)

// String returns "async" or "sync".
func (m FlushMode) String() string {
	if m == FlushSync {
		return "sync"
	}
	return "async"
}

// ParseFlushMode parses "async" or "sync" (case-insensitive).
func ParseFlushMode(s string) (FlushMode, error) {
	switch strings.ToLower(s) {
	case "async", "async_flush":
		return FlushAsync, nil
	case "sync", "sync_flush":
		return FlushSync, nil
	}
	return 0, fmt.Errorf("storage: unknown flush mode %q (want async or sync)", s)
}

// Role is the broker role of the store.
type Role uint8

const (
	// RoleMaster takes writes.
	RoleMaster Role = iota
	// RoleSlave refuses writes with SERVICE_NOT_AVAILABLE.
	RoleSlave
)

// String returns "master" or "slave".
func (r Role) String() string {
	if r == RoleSlave {
		return "slave"
	}
	return "master"
}

// ParseRole parses "master" or "slave" (case-insensitive).
func ParseRole(s string) (Role, error) {
	switch strings.ToLower(s) {
	case "master", "async_master", "sync_master":
		return RoleMaster, nil
	case "slave":
		return RoleSlave, nil
	}
	return 0, fmt.Errorf("storage: unknown role %q (want master or slave)", s)
}

const (
	// DefaultDelayLevels is RocketMQ's messageDelayLevel.
	DefaultDelayLevels = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
)

// Options configure a Store. The zero value of every field except Dir means
// "use the default" named in its comment. Open never modifies the caller's
// Options.
type Options struct {
	// Dir is the data directory. Required. The commitlog lives in
	// Dir/commitlog; Dir/lock holds the process lock.
	Dir string

	// FileSize is the size of every commitlog file in bytes. Default 1 GiB.
	// At least 4 KiB. Changing it on existing data makes Open fail.
	FileSize int64

	// MaxMessageSize is the largest body (and the largest batch, summed) in
	// bytes. Default 4 MiB. A record that cannot fit an empty commitlog file
	// is refused (MESSAGE_ILLEGAL) whatever this says.
	MaxMessageSize int

	// FlushMode is FlushAsync (default) or FlushSync.
	FlushMode FlushMode

	// FlushInterval is how often the async flusher runs. Default 500 ms.
	FlushInterval time.Duration

	// FlushLeastPages is how many dirty 4 KiB pages the async flusher waits
	// for before it flushes. Default 4. Negative means 0 (flush any change).
	// It decides only whether the flusher syncs before the next checkpoint:
	// the checkpoint syncs the whole commitlog every CheckpointInterval,
	// whatever is dirty (it records an offset as durable only after a sync
	// covering it), so in async mode a message is durable within
	// min(FlushThoroughInterval, CheckpointInterval) of its put at the
	// latest, 1 s with the defaults, and within about FlushInterval under a
	// load that dirties FlushLeastPages pages per interval.
	FlushLeastPages int

	// FlushThoroughInterval bounds the time the async flusher leaves a
	// trickle of dirty data (fewer than FlushLeastPages) unflushed. Default
	// 10 s. It matters only with a CheckpointInterval longer than it: the
	// checkpoint's sync comes first otherwise (see FlushLeastPages).
	FlushThoroughInterval time.Duration

	// WakeFlushOnPut wakes the async flusher after each put instead of
	// waiting for the interval. Default false (RocketMQ
	// wakeFlushWhenPutMessage).
	WakeFlushOnPut bool

	// SyncFlushTimeout is how long a sync-mode put waits for its flush before
	// it answers FLUSH_DISK_TIMEOUT (the message is stored). Default 5 s.
	SyncFlushTimeout time.Duration

	// PageCacheBusyTimeout: a put that finds the put lock held longer than
	// this is refused with OS_PAGE_CACHE_BUSY. Default 1 s.
	PageCacheBusyTimeout time.Duration

	// Role is RoleMaster (default) or RoleSlave (refuses writes).
	Role Role

	// DelayLevels is the delay level table, space separated, units s, m, h,
	// d. Default DefaultDelayLevels (18 levels, 1s … 2h).
	DelayLevels string

	// StoreHost is the address written into every record and into msgIds.
	// Default 127.0.0.1:10911.
	StoreHost netip.AddrPort

	// DisablePropCRC turns off the whole-record "__CRC32#" property. Default
	// false: every record carries it, so corruption anywhere in a record is
	// detected, not only in the body.
	DisablePropCRC bool

	// ConsumeQueueEntries is the number of 20-byte entries per consume-queue
	// file. Default 300,000 (RocketMQ). Changing it on existing data is not
	// supported.
	ConsumeQueueEntries int

	// MaxOpenQueueFiles bounds the consume-queue files open at once: the
	// least recently used idle one is closed to open another, so the number
	// of queues is bounded by disk, not by RLIMIT_NOFILE. Default 256.
	MaxOpenQueueFiles int

	// CheckpointInterval is how often the consume queues are flushed and the
	// checkpoint rewritten. Each checkpoint first syncs the whole commitlog
	// (Sync(0), ignoring FlushLeastPages), so it also bounds the async-mode
	// loss window: after a power cut, at most the puts of the last
	// CheckpointInterval (1 s by default) are lost. Default 1 s.
	CheckpointInterval time.Duration

	// FileReservedTime is how long commitlog files are kept: retention
	// deletes a file once its newest message is older than this, never the
	// file being written and never one holding a delayed message not yet
	// delivered. Default 72 h (RocketMQ fileReservedTime). Negative keeps
	// every file (the disk watermarks still apply).
	FileReservedTime time.Duration

	// DeleteWhen is when expired files are deleted: hours of the day on the
	// store clock's local time (TZ), separated by ';' ("04;16"), or "*" for
	// every hour. Default "04" (RocketMQ deleteWhen). Above DiskCleanPercent
	// expired files are deleted at once, whatever the hour.
	DeleteWhen string

	// DiskCleanPercent: while the data dir's file system is fuller than this
	// (df's Use%), expired files are deleted at once instead of at
	// DeleteWhen, and a store that stopped taking writes takes them again
	// only once usage is back at or below it. Default 85 (RocketMQ
	// diskSpaceCleanForciblyRatio). 1-100, at most DiskWarningPercent.
	DiskCleanPercent int

	// DiskWarningPercent: above this the store refuses puts
	// (SERVICE_NOT_AVAILABLE, an error wrapping ErrNotWritable and
	// ErrDiskFull; Writable is false) until usage is back at
	// DiskCleanPercent. Default 90 (RocketMQ diskSpaceWarningLevelRatio).
	// 1-100; 100 never refuses.
	DiskWarningPercent int

	// DiskCheckInterval is how often, on the store's clock, disk usage is
	// read and retention runs. Default 1 s.
	DiskCheckInterval time.Duration

	// StatDisk reports the usage of the file system holding a directory.
	// Default StatDisk (statfs(2)). Tests fake it. When it fails the
	// watermarks are not enforced (Stats.Disk.Err says why).
	StatDisk func(dir string) (DiskUsage, error)

	// DefaultQueues is the queue count of a topic created by a put
	// (auto-creation). Default DefaultQueues (8, RocketMQ
	// defaultTopicQueueNums). 1 to MaxQueues.
	DefaultQueues int

	// NoAutoCreateTopics turns topic auto-creation off: a put to a topic
	// not created through CreateTopic is refused (ErrTopicNotFound,
	// RocketMQ TOPIC_NOT_EXIST). Default false: auto-creation is on
	// (RocketMQ autoCreateTopicEnable).
	NoAutoCreateTopics bool

	// MaxTopics bounds the number of topics: creating one more, by a put
	// or CreateTopic, is refused with ErrTooManyTopics. Default
	// DefaultMaxTopics (10,000). 1 to maxMaxTopics (1,000,000: the table
	// is rewritten whole on every change).
	MaxTopics int

	// MaxConsumerOffsets bounds the (consumer group, topic, queue) keys of
	// committed offsets (consumer_offsets.go): a commit of one more is
	// refused with ErrTooManyOffsets. Default DefaultMaxConsumerOffsets
	// (100,000, ~100 bytes of memory each); 1 to 10,000,000.
	MaxConsumerOffsets int

	// MaxPopInflight and MaxPopInflightPerGroup bound the POP messages in
	// flight (received, not yet acknowledged nor redelivered: pop.go), in
	// all and per consumer group; a receive beyond them is refused with
	// ErrTooManyInflight. Defaults DefaultMaxPopInflight (200,000, ~150
	// bytes of memory each) and DefaultMaxPopInflightPerGroup (20,000);
	// 1 to 10,000,000, the group's at most the total.
	MaxPopInflight         int
	MaxPopInflightPerGroup int

	// MaxTimerMessages bounds the timer messages waiting for their time
	// (storage/timers' due index): a timer put beyond it is refused with
	// WHEEL_TIMER_FLOW_CONTROL (ErrTimerFull). Default
	// DefaultMaxTimerMessages (1,048,576; about 50 bytes of index each).
	MaxTimerMessages int

	// TimerMaxDelay is how far ahead a timer message may be due (RocketMQ
	// timerMaxDelaySec): one due later is refused with
	// WHEEL_TIMER_MSG_ILLEGAL. Default DefaultTimerMaxDelay (3 days).
	TimerMaxDelay time.Duration

	// Transactional half messages (transactions.go). TransactionTimeout is
	// how old a half message must be before its first check (RocketMQ
	// transactionTimeOut; a message's CHECK_IMMUNITY_TIME_IN_SECONDS
	// overrides it), TransactionCheckInterval the time between two checks
	// of one half and between two rounds of the check loop (RocketMQ
	// transactionCheckInterval), TransactionCheckMax the checks before a
	// half is discarded as rolled back (RocketMQ transactionCheckMax).
	// MaxPendingTransactions bounds the pending halves: a half send
	// beyond it is refused (ErrTransactionsFull, TOO_MANY_REQUESTS to
	// the RocketMQ clients). Defaults DefaultTransactionTimeout (6 s),
	// DefaultTransactionCheckInterval (30 s), DefaultTransactionCheckMax
	// (15), DefaultMaxPendingTransactions (100,000; measured ~130 bytes a
	// pending half, plus ~80 for each of as many remembered ends).
	TransactionTimeout       time.Duration
	TransactionCheckInterval time.Duration
	TransactionCheckMax      int
	MaxPendingTransactions   int
	// txnManual (tests) starts no check loop: rounds run by hand.
	txnManual bool

	// DedupWindow is how long a put carrying a UNIQ_KEY is remembered
	// after its store time: a put of the same key (and topic) within it is
	// answered with the first put's result and stores nothing
	// (idempotent.go). Default DefaultDedupWindow (10 min); negative
	// turns deduplication off.
	DedupWindow time.Duration

	// DedupMaxMessages bounds the messages the dedup window remembers (a
	// batch counts its messages): past it the oldest keys are forgotten
	// first, so a client sending fresh keys forever holds a bounded amount
	// of memory (about 205 bytes a message: TestDedupBytesPerKey). Default
	// DefaultDedupMaxMessages (262,144: about 51 MiB at the bound).
	DedupMaxMessages int

	// DedupRebuildBytes bounds how much of the log's tail Open reads to
	// rebuild the dedup window (the records stored within DedupWindow, at
	// most this many bytes back, whole files). Default
	// DefaultDedupRebuildBytes (1 GiB).
	DedupRebuildBytes int64

	// FS is the file system the store runs on. Default vfs.Default (the OS,
	// mmap, msync). Tests pass a *vfs.MemFS to simulate power cuts and
	// inject I/O errors.
	FS vfs.FS

	// Clock is the store's time source. Default SystemClock.
	Clock Clock

	// PopulateChunk is how much of a new commitlog file the allocator
	// faults in for writing at a time, off the put path. Default 32 MiB
	// (segment.DefaultPopulateChunk); tests use small chunks.
	PopulateChunk int64

	// PopulateAhead is how far ahead of the writer the allocator keeps the
	// commitlog file appends go to populated, and how much of the next
	// file it populates before the roll. Default 128 MiB
	// (segment.DefaultPopulateAhead); at least FileSize populates whole
	// files at once, as before this option (each written twice on the
	// disk: BENCHMARKS.md, "Population in a window").
	PopulateAhead int64

	// PopulateNear is how much of that window, just ahead of the writer,
	// vfs.PopulateWrite makes writable (dirty zeros, no fault on the put
	// path); the rest of the window is populated read (clean). Default 16
	// MiB (segment.DefaultPopulateNear); PopulateAhead or more makes the
	// whole window writable, whose dirty zeros the kernel then wrote back
	// in one burst every 30 s (BENCHMARKS.md, "Dirty zeros: a stall every
	// 30 s").
	PopulateNear int64

	// Populate is how the allocator faults new commitlog files in ahead of
	// the writer: vfs.PopulateWrite (the default: MADV_POPULATE_WRITE, no
	// fault on the put path), PopulateRead, PopulateWillNeed, PopulateOff
	// or PopulateZero (vfs.PopulateMode; BENCHMARKS.md "Allocator
	// population and sync-mode msync" has the A/B).
	Populate vfs.PopulateMode

	// Logger receives the store's rare events (slow syncs, rolls, recovery).
	// Default: a disabled logger.
	Logger *zerolog.Logger

	// Group, when set, makes the store one replica of a raft group
	// (group.go, design replication.md): puts only on the elected, ready
	// leader, acknowledged once committed on a majority. It needs
	// FlushMode sync and Role master. Nil: a standalone store.
	Group *GroupOptions
}

// Defaults of Options.
const (
	DefaultFileSize              = 1 << 30
	DefaultMaxMessageSize        = 4 << 20
	DefaultFlushInterval         = flush.DefaultInterval
	DefaultFlushLeastPages       = flush.DefaultLeastPages
	DefaultFlushThoroughInterval = flush.DefaultThoroughInterval
	DefaultSyncFlushTimeout      = flush.DefaultTimeout
	DefaultPageCacheBusyTimeout  = time.Second
	DefaultCheckpointInterval    = time.Second
	DefaultMaxOpenQueueFiles     = 256
	DefaultFileReservedTime      = 72 * time.Hour
	DefaultDeleteWhen            = "04"
	DefaultDiskCleanPercent      = 85
	DefaultDiskWarningPercent    = 90
	DefaultDiskCheckInterval     = time.Second
	DefaultMaxTimerMessages      = timers.DefaultMaxPending
	DefaultTimerMaxDelay         = 259200 * time.Second // RocketMQ timerMaxDelaySec

	DefaultTransactionTimeout       = 6 * time.Second  // RocketMQ transactionTimeOut
	DefaultTransactionCheckInterval = 30 * time.Second // RocketMQ transactionCheckInterval
	DefaultTransactionCheckMax      = 15               // RocketMQ transactionCheckMax
	DefaultMaxPendingTransactions   = 100000
	DefaultDedupWindow              = 10 * time.Minute
	DefaultDedupMaxMessages         = 1 << 18
	DefaultPopulateAhead            = segment.DefaultPopulateAhead
	DefaultPopulateNear             = segment.DefaultPopulateNear
	DefaultDedupRebuildBytes        = 1 << 30
	minFileSize                     = 4 << 10
	maxFileSize                     = 1 << 40
	maxMaxTopics                    = 1000000
)

// DefaultConsumeQueueEntries is the number of entries per consume-queue
// file (RocketMQ mappedFileSizeConsumeQueue / 20).
const DefaultConsumeQueueEntries = consumequeue.DefaultEntries

// DefaultStoreHost is the store host used when Options.StoreHost is unset.
var DefaultStoreHost = netip.MustParseAddrPort("127.0.0.1:10911")

// withDefaults returns a copy of o with every unset field defaulted.
func (o Options) withDefaults() Options {
	if o.FileSize == 0 {
		o.FileSize = DefaultFileSize
	}
	if o.MaxMessageSize == 0 {
		o.MaxMessageSize = DefaultMaxMessageSize
	}
	if o.FlushInterval == 0 {
		o.FlushInterval = DefaultFlushInterval
	}
	if o.FlushLeastPages == 0 {
		o.FlushLeastPages = DefaultFlushLeastPages
	} else if o.FlushLeastPages < 0 {
		o.FlushLeastPages = 0
	}
	if o.FlushThoroughInterval == 0 {
		o.FlushThoroughInterval = DefaultFlushThoroughInterval
	}
	if o.SyncFlushTimeout == 0 {
		o.SyncFlushTimeout = DefaultSyncFlushTimeout
	}
	if o.PageCacheBusyTimeout == 0 {
		o.PageCacheBusyTimeout = DefaultPageCacheBusyTimeout
	}
	if o.ConsumeQueueEntries == 0 {
		o.ConsumeQueueEntries = DefaultConsumeQueueEntries
	}
	if o.CheckpointInterval == 0 {
		o.CheckpointInterval = DefaultCheckpointInterval
	}
	if o.MaxOpenQueueFiles == 0 {
		o.MaxOpenQueueFiles = DefaultMaxOpenQueueFiles
	}
	if o.DelayLevels == "" {
		o.DelayLevels = DefaultDelayLevels
	}
	if o.FileReservedTime == 0 {
		o.FileReservedTime = DefaultFileReservedTime
	}
	if o.DeleteWhen == "" {
		o.DeleteWhen = DefaultDeleteWhen
	}
	if o.DiskCleanPercent == 0 {
		o.DiskCleanPercent = DefaultDiskCleanPercent
	}
	if o.DiskWarningPercent == 0 {
		o.DiskWarningPercent = DefaultDiskWarningPercent
	}
	if o.DiskCheckInterval == 0 {
		o.DiskCheckInterval = DefaultDiskCheckInterval
	}
	if o.DefaultQueues == 0 {
		o.DefaultQueues = DefaultQueues
	}
	if o.MaxTopics == 0 {
		o.MaxTopics = DefaultMaxTopics
	}
	if o.MaxConsumerOffsets == 0 {
		o.MaxConsumerOffsets = DefaultMaxConsumerOffsets
	}
	if o.MaxPopInflight == 0 {
		o.MaxPopInflight = DefaultMaxPopInflight
	}
	if o.MaxPopInflightPerGroup == 0 {
		o.MaxPopInflightPerGroup = min(DefaultMaxPopInflightPerGroup, o.MaxPopInflight)
	}
	if o.MaxTimerMessages == 0 {
		o.MaxTimerMessages = DefaultMaxTimerMessages
	}
	if o.TimerMaxDelay == 0 {
		o.TimerMaxDelay = DefaultTimerMaxDelay
	}
	if o.TransactionTimeout == 0 {
		o.TransactionTimeout = DefaultTransactionTimeout
	}
	if o.TransactionCheckInterval == 0 {
		o.TransactionCheckInterval = DefaultTransactionCheckInterval
	}
	if o.TransactionCheckMax == 0 {
		o.TransactionCheckMax = DefaultTransactionCheckMax
	}
	if o.MaxPendingTransactions == 0 {
		o.MaxPendingTransactions = DefaultMaxPendingTransactions
	}
	if o.DedupWindow == 0 {
		o.DedupWindow = DefaultDedupWindow
	}
	if o.DedupMaxMessages == 0 {
		o.DedupMaxMessages = DefaultDedupMaxMessages
	}
	if o.DedupRebuildBytes == 0 {
		o.DedupRebuildBytes = DefaultDedupRebuildBytes
	}
	if o.StatDisk == nil {
		o.StatDisk = StatDisk
	}
	if !o.StoreHost.IsValid() {
		o.StoreHost = DefaultStoreHost
	}
	if o.Clock == nil {
		o.Clock = SystemClock
	}
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.Logger == nil {
		nop := zerolog.Nop()
		o.Logger = &nop
	}
	if o.Group != nil {
		g := *o.Group
		g.withDefaults(o)
		o.Group = &g
	}
	return o
}

// Validate reports the problems with o (after defaults are applied), or
// nil. Open calls it; callers may call it early to fail fast on flags.
func (o Options) Validate() error {
	_, err := o.withDefaults().resolve()
	return err
}

// ParseDelayLevels parses a delay level table such as
// "1s 5s 10s 30s 1m 2m … 2h". Level i (from 1) is element i-1.
func ParseDelayLevels(s string) ([]time.Duration, error) { return schedule.ParseDelayLevels(s) }

// resolved is what Options say once parsed: each option is parsed once, by
// resolve, and the parts take the parsed values.
type resolved struct {
	delayLevels []time.Duration
	deleteHours [24]bool
}

// resolve validates o (defaults applied) and parses what needs parsing.
func (o Options) resolve() (resolved, error) {
	var r resolved
	var errs []error
	if o.Dir == "" {
		errs = append(errs, errors.New("Dir is required"))
	}
	if o.FileSize < minFileSize || o.FileSize > maxFileSize {
		errs = append(errs, fmt.Errorf("FileSize %d out of range [%d, %d]", o.FileSize, minFileSize, int64(maxFileSize)))
	}
	if o.MaxMessageSize < 1 {
		errs = append(errs, fmt.Errorf("MaxMessageSize %d must be positive", o.MaxMessageSize))
	}
	if o.ConsumeQueueEntries < 1 {
		errs = append(errs, fmt.Errorf("ConsumeQueueEntries %d must be positive", o.ConsumeQueueEntries))
	}
	if o.MaxOpenQueueFiles < 1 {
		errs = append(errs, fmt.Errorf("MaxOpenQueueFiles %d must be positive", o.MaxOpenQueueFiles))
	}
	if o.FlushInterval < 0 || o.CheckpointInterval < 0 || o.FlushThoroughInterval < 0 || o.SyncFlushTimeout < 0 || o.PageCacheBusyTimeout < 0 {
		errs = append(errs, errors.New("durations must not be negative"))
	}
	if o.FlushMode != FlushAsync && o.FlushMode != FlushSync {
		errs = append(errs, fmt.Errorf("unknown FlushMode %d", o.FlushMode))
	}
	if o.Role != RoleMaster && o.Role != RoleSlave {
		errs = append(errs, fmt.Errorf("unknown Role %d", o.Role))
	}
	var err error
	if r.delayLevels, err = schedule.ParseDelayLevels(o.DelayLevels); err != nil {
		errs = append(errs, err)
	}
	if r.deleteHours, err = retention.ParseDeleteWhen(o.DeleteWhen); err != nil {
		errs = append(errs, err)
	}
	if o.DiskWarningPercent < 1 || o.DiskWarningPercent > 100 || o.DiskCleanPercent < 1 || o.DiskCleanPercent > o.DiskWarningPercent {
		errs = append(errs, fmt.Errorf("disk watermarks: want 1 <= DiskCleanPercent (%d) <= DiskWarningPercent (%d) <= 100",
			o.DiskCleanPercent, o.DiskWarningPercent))
	}
	if o.DiskCheckInterval < 0 {
		errs = append(errs, errors.New("DiskCheckInterval must not be negative"))
	}
	if o.DefaultQueues < 1 || o.DefaultQueues > MaxQueues {
		errs = append(errs, fmt.Errorf("DefaultQueues %d out of range [1, %d]", o.DefaultQueues, MaxQueues))
	}
	if o.MaxTopics < 1 || o.MaxTopics > maxMaxTopics {
		errs = append(errs, fmt.Errorf("MaxTopics %d out of range [1, %d]", o.MaxTopics, maxMaxTopics))
	}
	if o.MaxConsumerOffsets < 1 || o.MaxConsumerOffsets > 10000000 {
		errs = append(errs, fmt.Errorf("MaxConsumerOffsets %d out of range [1, 10000000]", o.MaxConsumerOffsets))
	}
	if o.MaxPopInflight < 1 || o.MaxPopInflight > 10000000 {
		errs = append(errs, fmt.Errorf("MaxPopInflight %d out of range [1, 10000000]", o.MaxPopInflight))
	}
	if o.MaxPopInflightPerGroup < 1 || o.MaxPopInflightPerGroup > o.MaxPopInflight {
		errs = append(errs, fmt.Errorf("MaxPopInflightPerGroup %d out of range [1, MaxPopInflight %d]", o.MaxPopInflightPerGroup, o.MaxPopInflight))
	}
	if o.MaxTimerMessages < 1 || o.MaxTimerMessages > 1<<26 {
		errs = append(errs, fmt.Errorf("MaxTimerMessages %d out of range [1, %d]", o.MaxTimerMessages, 1<<26))
	}
	if o.TimerMaxDelay < time.Second || o.TimerMaxDelay > 366*24*time.Hour {
		errs = append(errs, fmt.Errorf("TimerMaxDelay %v out of range [1s, 366 days]", o.TimerMaxDelay))
	}
	if o.TransactionTimeout < time.Second || o.TransactionTimeout > 24*time.Hour {
		errs = append(errs, fmt.Errorf("TransactionTimeout %v out of range [1s, 24h]", o.TransactionTimeout))
	}
	if o.TransactionCheckInterval < time.Second || o.TransactionCheckInterval > 24*time.Hour {
		errs = append(errs, fmt.Errorf("TransactionCheckInterval %v out of range [1s, 24h]", o.TransactionCheckInterval))
	}
	if o.TransactionCheckMax < 1 || o.TransactionCheckMax > 1000 {
		errs = append(errs, fmt.Errorf("TransactionCheckMax %d out of range [1, 1000]", o.TransactionCheckMax))
	}
	if o.MaxPendingTransactions < 1 || o.MaxPendingTransactions > 10000000 {
		errs = append(errs, fmt.Errorf("MaxPendingTransactions %d out of range [1, 10000000]", o.MaxPendingTransactions))
	}
	if o.DedupWindow > 0 && o.DedupWindow < time.Millisecond {
		errs = append(errs, fmt.Errorf("DedupWindow %v: at least 1ms, or negative (off)", o.DedupWindow))
	}
	if o.DedupMaxMessages < 1 || o.DedupRebuildBytes < 1 {
		errs = append(errs, fmt.Errorf("DedupMaxMessages (%d) and DedupRebuildBytes (%d) must be positive", o.DedupMaxMessages, o.DedupRebuildBytes))
	}
	if o.StoreHost.Port() == 0 {
		errs = append(errs, fmt.Errorf("StoreHost %s needs a port", o.StoreHost))
	}
	if o.PopulateChunk < 0 {
		errs = append(errs, errors.New("PopulateChunk must not be negative"))
	}
	if o.PopulateAhead < 0 {
		errs = append(errs, errors.New("PopulateAhead must not be negative"))
	}
	if o.PopulateNear < 0 {
		errs = append(errs, errors.New("PopulateNear must not be negative"))
	}
	if o.Group != nil {
		errs = append(errs, o.Group.validate(o)...)
	}
	if o.Populate > vfs.PopulateZero {
		errs = append(errs, fmt.Errorf("Populate %v unknown", o.Populate))
	}
	if len(errs) > 0 {
		return resolved{}, fmt.Errorf("storage: invalid options: %w", errors.Join(errs...))
	}
	return r, nil
}
