package snapshot

import (
	"errors"
	"fmt"
	"hash/crc32"

	"github.com/storaged/storaged/storage/record"
)

// Source is the commitlog as the sender reads it (commitlog.Log): At
// returns the mapped bytes of the file holding off, from off to the file's
// end, or nil; the bytes are valid only between ReadLock and ReadUnlock
// (retention may unmap a file otherwise).
type Source interface {
	ReadLock()
	ReadUnlock()
	At(off int64) []byte
}

// DefaultChunkBytes is the size of a chunk Read produces.
const DefaultChunkBytes = 1 << 20

// MaxChunkBytes bounds a chunk a Stage accepts (the peer service's
// message bound is 16 MiB).
const MaxChunkBytes = 4 << 20

// ErrGone: a file of the manifest is no longer in the source (retention
// deleted it) or no longer has the bytes the manifest recorded.
var ErrGone = errors.New("snapshot: the source no longer holds the manifest's bytes")

// Chunk is one piece of a file in transfer: bytes [Offset, Offset+len(Data))
// of the file starting at commitlog offset File, and their CRC-32C.
type Chunk struct {
	File   int64
	Offset int64
	Data   []byte
	CRC    uint32
}

// copyOut copies n bytes at commitlog offset off under the read guard.
func copyOut(src Source, off int64, n int64, buf []byte) ([]byte, error) {
	src.ReadLock()
	defer src.ReadUnlock()
	b := src.At(off)
	if int64(len(b)) < n {
		return nil, fmt.Errorf("%w: %d bytes at %d, %d there", ErrGone, n, off, len(b))
	}
	return append(buf[:0], b[:n]...), nil
}

// Files lists the files from minOffset to end with the CRC-32C of their
// bytes, read from src in chunks of DefaultChunkBytes (the read guard is
// held for one chunk at a time, so retention is never held up for long;
// the caller pins the files against retention meanwhile).
func Files(src Source, fileSize, minOffset, end int64) ([]File, error) {
	if fileSize <= 0 || minOffset%fileSize != 0 || end < minOffset {
		return nil, fmt.Errorf("%w: file size %d, min offset %d, end %d", ErrBadManifest, fileSize, minOffset, end)
	}
	var files []File
	buf := make([]byte, 0, DefaultChunkBytes)
	for from := minOffset; from < end; from += fileSize {
		f := File{From: from, Size: min(fileSize, end-from)}
		var crc uint32
		for off := int64(0); off < f.Size; {
			n := min(DefaultChunkBytes, f.Size-off)
			b, err := copyOut(src, from+off, n, buf)
			if err != nil {
				return nil, err
			}
			crc = crc32.Update(crc, castagnoli, b)
			off += n
		}
		f.CRC = crc
		files = append(files, f)
	}
	return files, nil
}

// Read streams the manifest's files from src as chunks of at most
// chunkBytes (0: DefaultChunkBytes), in order, calling send for each. The
// chunk's Data is reused after send returns. It checks each file's CRC
// against the manifest as it goes, so bytes that changed under the sender
// are never passed off as the snapshot (ErrGone). It stops at send's first
// error and returns it.
func Read(src Source, m *Manifest, chunkBytes int, send func(Chunk) error) error {
	if chunkBytes <= 0 {
		chunkBytes = DefaultChunkBytes
	}
	chunkBytes = min(chunkBytes, MaxChunkBytes)
	buf := make([]byte, 0, chunkBytes)
	for _, f := range m.Files {
		var crc uint32
		for off := int64(0); off < f.Size; {
			n := min(int64(chunkBytes), f.Size-off)
			b, err := copyOut(src, f.From+off, n, buf)
			if err != nil {
				return err
			}
			buf = b
			c := CRC(b)
			crc = crc32.Update(crc, castagnoli, b)
			if off+n == f.Size && crc != f.CRC {
				return fmt.Errorf("%w: file %d's CRC is %08x, the manifest says %08x", ErrGone, f.From, crc, f.CRC)
			}
			if err := send(Chunk{File: f.From, Offset: off, Data: b, CRC: c}); err != nil {
				return err
			}
			off += n
		}
	}
	return nil
}

// LastStoreTS is the store time of the last record in [from, end), one
// file's records from its start (from) to the commit end: store times
// never go backwards along the log, so it is the newest below end. 0 when
// the range is empty.
func LastStoreTS(src Source, from, end int64) (int64, error) {
	src.ReadLock()
	defer src.ReadUnlock()
	b := src.At(from)
	if int64(len(b)) < end-from {
		return 0, fmt.Errorf("%w: [%d, %d)", ErrGone, from, end)
	}
	b = b[:end-from]
	var ts int64
	for off := 0; off < len(b); {
		h, err := record.Parse(b[off:])
		if err != nil || h.Total <= 0 || off+int(h.Total) > len(b) {
			return 0, fmt.Errorf("snapshot: no record at commitlog offset %d below the end %d: %v", from+int64(off), end, err)
		}
		ts = record.StoreTimestamp(b[off:])
		off += int(h.Total)
	}
	return ts, nil
}

// Outgoing is a snapshot on its way to one peer, as the store hands it
// to the peer transport (server/peer's SendSnapshot). The transport calls
// Message, then Read, from its own goroutine, and Done exactly once.
type Outgoing interface {
	// Message is the marshalled raftpb.Message of type MsgSnap whose
	// snapshot data is the encoded manifest (built here, off the raft
	// goroutine: it reads every file for its CRC).
	Message() ([]byte, error)
	// Read calls send for every chunk of file bytes, in order (Read), and
	// stops at send's first error. data is reused after send returns.
	Read(chunkBytes int, send func(file, offset int64, data []byte, crc uint32) error) error
	// Done tells the outcome: nil once the receiver took the snapshot.
	Done(err error)
}
