package storage

import (
	"errors"

	"github.com/storaged/storaged/storage/consumequeue"
	"github.com/storaged/storaged/storage/internal/base"
)

// Errors returned by the store. Callers match them with errors.Is; the
// store wraps them with context (file names, offsets, causes).
var (
	// ErrClosed is returned by every operation on a store after Close.
	ErrClosed = base.ErrClosed

	// ErrNotWritable is returned by puts while the store refuses writes for a
	// reason an operator can clear (disk above the warning watermark, …).
	ErrNotWritable = base.ErrNotWritable

	// ErrWriteRetrying is wrapped with ErrNotWritable (and ErrDiskFull when
	// the cause is ENOSPC) while a background write of the store (the
	// checkpoint, a consume queue, the delay progress)
	// is failing and being retried: puts are refused until a retry
	// succeeds, then resume by themselves. Unlike ErrWriteFailed it is not
	// sticky.
	ErrWriteRetrying = base.ErrWriteRetrying

	// ErrSlave is returned by puts when the store runs in the SLAVE role.
	ErrSlave = errors.New("storage: store is a slave and takes no writes")

	// ErrWriteFailed is sticky: once an msync/fdatasync or a write to a
	// mapped file has failed, every later put fails with an error that wraps
	// it, until the store is reopened and recovered. Nothing written after the
	// failure is ever acknowledged (fsyncgate: a retried sync may "succeed"
	// over pages the kernel already dropped).
	ErrWriteFailed = base.ErrWriteFailed

	// ErrIllegal marks a message or batch the store refuses to take
	// (MESSAGE_ILLEGAL or PROPERTIES_SIZE_EXCEEDED). The wrapping
	// *ValidationError names the field.
	ErrIllegal = errors.New("storage: illegal message")

	// ErrBusy is returned when the put lock has been held longer than
	// Options.PageCacheBusyTimeout (OS_PAGE_CACHE_BUSY). Nothing was written;
	// the put may be retried.
	ErrBusy = errors.New("storage: os page cache busy")

	// ErrCreateFile is returned when the next commitlog file could not be
	// created, preallocated or mapped (CREATE_MAPPED_FILE_FAILED).
	ErrCreateFile = base.ErrCreateFile

	// ErrDiskFull is wrapped with ErrCreateFile when preallocation failed
	// for lack of space (ENOSPC): an error at creation, never a SIGBUS
	// later. It is also wrapped with ErrNotWritable while the data dir's
	// file system is above Options.DiskWarningPercent (puts refused with
	// SERVICE_NOT_AVAILABLE until usage is back at DiskCleanPercent).
	ErrDiskFull = base.ErrDiskFull

	// ErrLocked is returned by Open when another process holds the data dir.
	ErrLocked = errors.New("storage: data dir is locked by another process")
)

// ValidationError says which part of a message made it illegal. It wraps
// ErrIllegal so errors.Is(err, ErrIllegal) holds.
type ValidationError struct {
	Status PutStatus // MessageIllegal or PropertiesSizeExceeded
	Field  string    // "topic", "body", "properties", "batch", …
	Reason string    // human-readable, no paths
}

func (e *ValidationError) Error() string {
	return "storage: illegal message: " + e.Field + ": " + e.Reason
}

// Unwrap implements errors.Unwrap.
func (e *ValidationError) Unwrap() error { return ErrIllegal }

func illegal(field, reason string) *ValidationError {
	return &ValidationError{Status: MessageIllegal, Field: field, Reason: reason}
}

// CorruptionError reports damage to data that was acknowledged as durable:
// a record below the checkpoint's flushed offset fails its checks. Open
// refuses to start rather than silently dropping the rest of the log.
type CorruptionError = base.CorruptionError

// CheckpointError reports a checkpoint file that fails its checks.
type CheckpointError = consumequeue.CheckpointError
