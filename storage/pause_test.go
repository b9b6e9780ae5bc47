package storage

// pause stops every writer of the store's files at a consistent point:
// no dispatch round or checkpoint (runMu), no sync (syncMu), no append
// (put). The returned func resumes. Lock order matches the dispatcher's
// (runMu, then syncMu inside checkpoint, then put in lastStoreTime).
func (s *Store) pause() (resume func()) {
	s.dispatch.runMu.Lock()
	s.queue.syncMu.Lock()
	s.put.Lock()
	return func() {
		s.put.Unlock()
		s.queue.syncMu.Unlock()
		s.dispatch.runMu.Unlock()
	}
}
