package commitlog

// Test seams: the storage facade's tests stop the log at consistent points
// and fake a held lock through these; nothing else calls them.

// Hold stops syncs, then appends, until release.
func (l *Log) Hold() (release func()) {
	releaseSync := l.list.HoldSync()
	l.mu.Lock()
	return func() {
		l.mu.Unlock()
		releaseSync()
	}
}

// SetLockedSince makes Busy see the append lock as taken at ns (Unix ns on
// the store's clock; 0: free), as an append stuck in the lock would.
func (l *Log) SetLockedSince(ns int64) { l.beginTimeInLock.Store(ns) }
