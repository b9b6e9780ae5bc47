package schedule

// Test seams: the storage facade's tests drive rounds themselves and read
// the scheduler's counters through these; nothing else calls them.

// Halt stops the delivery goroutine without persisting, so that a test
// drives rounds itself (RoundOnce); Stop still persists.
func (sc *Scheduler) Halt() {
	sc.rounds.Halt()
}

// RoundOnce runs one round and reports whether it ended on a refused
// re-put (to be retried).
func (sc *Scheduler) RoundOnce() (retry bool) { return sc.round().Retry }

// Delivered is the number of messages of queue qid delivered since New.
func (sc *Scheduler) Delivered(qid int) uint64 { return sc.delivered[qid].Load() }

// Levels is the number of levels served.
func (sc *Scheduler) Levels() int { return sc.levels }

// Skipped counts the messages passed over.
func (sc *Scheduler) Skipped() uint64 { return sc.skipped.Load() }

// NextOffset is queue qid's next queue offset to deliver.
func (sc *Scheduler) NextOffset(qid int) int64 { return sc.next[qid].Load() }

// PersistedOffset is queue qid's progress on disk.
func (sc *Scheduler) PersistedOffset(qid int) int64 { return sc.persisted[qid].Load() }

// Need is the commitlog offset the re-puts since the last persist end at.
func (sc *Scheduler) Need() int64 {
	sc.mu.Lock()
	defer sc.mu.Unlock()
	return sc.need
}

// Hold stops rounds and persists until release.
func (sc *Scheduler) Hold() (release func()) {
	sc.mu.Lock()
	return sc.mu.Unlock
}

// BatchSize bounds the deliveries of one level per pass; PollInterval is
// how often (on the store's clock) a level with nothing pending is looked
// at.
const (
	BatchSize    = scheduleBatch
	PollInterval = schedulePoll
)
