package consumequeue

// Test seams. The storage facade's tests stop the store at consistent
// points and provoke failed rounds through these; nothing else calls them.

// Hold stops checkpoints and dispatch rounds until resume is called (lock
// order: checkpoints, then rounds). Resume wakes the puts that waited.
func (d *Index) Hold() (resume func()) {
	d.cpMu.Lock()
	d.runMu.Lock()
	return func() {
		d.unlockRun()
		d.cpMu.Unlock()
	}
}

// HoldRounds stops dispatch rounds (not checkpoints' syncs) until resume.
func (d *Index) HoldRounds() (resume func()) {
	d.runMu.Lock()
	return d.unlockRun
}

// NextRelease returns a channel closed when the next round or checkpoint
// snapshot ends, and the func that ends the wait.
func (d *Index) NextRelease() (<-chan struct{}, func()) {
	return d.progress.wait(), d.progress.done
}

// Waiting is the number of puts waiting for a round to end.
func (d *Index) Waiting() int32 { return d.progress.waiting.Load() }

// SetAfterSnapshot has fn run once a checkpoint has taken its snapshot and
// released the round lock. Set before any checkpoint runs.
func (d *Index) SetAfterSnapshot(fn func()) {
	d.cpMu.Lock()
	d.afterSnapshot = fn
	d.cpMu.Unlock()
}

// RunErr runs a round up to end and returns its error.
func (d *Index) RunErr(end int64) error {
	d.runMu.Lock()
	defer d.unlockRun()
	_, err := d.runLocked(end)
	return err
}

// Next is the next commitlog offset the dispatcher will index.
func (d *Index) Next() int64 {
	d.runMu.Lock()
	defer d.unlockRun()
	return d.next
}

// SetNext moves the dispatch position (a test makes the next round fail by
// pointing it outside the log).
func (d *Index) SetNext(next int64) {
	d.runMu.Lock()
	defer d.unlockRun()
	d.next = next
}

// PollsWaiting is the number of long polls registered with the notifier,
// and Registrations the number of queues they wait on.
func (d *Index) PollsWaiting() int64 { return d.notify.waiting.Load() }

// Registrations is the number of queues long polls wait on.
func (d *Index) Registrations() int {
	d.notify.mu.Lock()
	defer d.notify.mu.Unlock()
	return len(d.notify.waits)
}
