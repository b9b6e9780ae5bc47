package timers

// Test seams: the storage facade's tests drive rounds themselves; nothing
// else calls them.

// Halt stops the delivery goroutine without persisting, so that a test
// drives rounds itself (RoundOnce); Stop still persists.
func (sv *Service) Halt() {
	sv.rounds.Halt()
}

// RoundOnce runs one round and reports whether it ended on a refused
// re-put (to be retried).
func (sv *Service) RoundOnce() (retry bool) { return sv.round().Retry }

// Hold stops rounds, recalls and persists until release.
func (sv *Service) Hold() (release func()) {
	sv.mu.Lock()
	return sv.mu.Unlock
}

// RoundBatch bounds the deliveries of one pass.
const RoundBatch = roundBatch
