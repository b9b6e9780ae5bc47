// Package segment is the commitlog's files: fixed-size files, preallocated
// (a full disk is an error at creation, never a SIGBUS later) and mapped
// shared through a vfs.Segment; the ordered list of them (List) with no
// gaps; the allocator goroutine that creates the next file ahead of need
// (when its owner asks: List.Prepare) and faults it in for writing in
// chunks, off the append path; and the
// read guard (List.ReadLock) that keeps a file mapped while a reader uses
// its bytes, which retention's Unmap waits for.
//
// It owns the files' positions (written and flushed, atomics, so readers
// and flushers need no lock) and the list's lock. It knows nothing of
// records: a file is bytes. It must never sync on its own (the flush
// policy and the checkpoint decide when, through List.Sync), never unmap a
// file a reader holds, and never delete a file (retention does, after
// Unmap).
package segment
