package storage

// pause stops every writer of the store's files at a consistent point:
// no checkpoint (cpMu), no dispatch round (runMu), no sync (syncMu), no
// append (put). The returned func resumes. Lock order matches the
// dispatcher's (cpMu, runMu, then syncMu inside checkpoint, then put in
// lastStoreTime).
func (s *Store) pause() (resume func()) {
	s.dispatch.cpMu.Lock()
	s.dispatch.runMu.Lock()
	s.queue.syncMu.Lock()
	s.put.Lock()
	return func() {
		s.put.Unlock()
		s.queue.syncMu.Unlock()
		s.dispatch.unlockRun() // wakes the puts that waited to dispatch
		s.dispatch.cpMu.Unlock()
	}
}

// crash stops the store the way a killed process would: goroutines stop,
// nothing more is flushed or checkpointed, the abort marker stays, files
// are unmapped and the lock released. What the page cache holds is kept
// (as after kill -9).
func (s *Store) crash() {
	s.closed.Store(true)
	s.put.Lock()
	s.put.Unlock()
	s.dispatch.stop()
	if s.sched != nil {
		s.sched.stop()
	}
	if s.ret != nil {
		s.ret.stop()
	}
	// The flusher's goroutine must end too. Its final sync changes nothing
	// a reader of the page cache sees, which is all a kill -9 leaves.
	s.flusher.Close()
	s.dispatch.close()
	s.queue.close()
	s.lockFile.Close()
}

// nextRelease returns a channel closed when runMu is next released (a
// dispatch round or a checkpoint ended), and the func that ends the wait.
func (d *dispatcher) nextRelease() (<-chan struct{}, func()) {
	return d.progress.wait(), d.progress.done
}
