package flush

import "time"

// The policies' defaults, in one place: storage.Options documents and
// re-exports them (storage.DefaultFlushInterval is DefaultInterval, …).
const (
	DefaultInterval         = 500 * time.Millisecond // Async: between flush attempts
	DefaultLeastPages       = 4                      // Async: dirty pages a flush waits for
	DefaultThoroughInterval = 10 * time.Second       // Async: longest a trickle waits
	DefaultTimeout          = 5 * time.Second        // GroupCommit: bound of each Wait
)
