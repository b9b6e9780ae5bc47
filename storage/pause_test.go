package storage

// pause stops every writer of the store's files at a consistent point:
// no checkpoint, no dispatch round (Index.Hold), no sync, no append
// (Log.Hold). The returned func resumes. Lock order matches the
// checkpoint's (checkpoints, rounds, then the sync inside the checkpoint).
func (s *Store) pause() (resume func()) {
	resumeIndex := s.index.Hold()
	resumeLog := s.log.Hold()
	return func() {
		resumeLog()
		resumeIndex() // wakes the puts that waited to dispatch
	}
}

// crash stops the store the way a killed process would: goroutines stop,
// nothing more is flushed or checkpointed, the abort marker stays, files
// are unmapped and the lock released. What the page cache holds is kept
// (as after kill -9).
func (s *Store) crash() {
	s.closed.Store(true)
	s.haltStateSnapshots() // no snapshot: a killed process writes nothing more
	s.stopTxn()
	s.log.Drain()
	s.index.Stop()
	if s.sched != nil {
		s.sched.Stop()
	}
	if s.timers != nil {
		s.timers.Halt() // no persist: a killed process writes nothing more
	}
	if s.ret != nil {
		s.ret.Stop()
	}
	// The flusher's goroutine must end too. Its final sync changes nothing
	// a reader of the page cache sees, which is all a kill -9 leaves.
	s.flusher.Close()
	s.index.Close()
	s.log.Close()
	s.lockFile.Close()
}
