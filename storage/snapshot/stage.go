package snapshot

import (
	"errors"
	"fmt"
	"hash/crc32"
	"path/filepath"

	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/vfs"
)

// ErrBadChunk: a chunk the stage refuses (not the next one, past its
// file's size, a wrong CRC, a file whose CRC is wrong at its end).
var ErrBadChunk = errors.New("snapshot: bad chunk")

// ErrVerify: the staged files are complete but their records do not
// verify (the scan stops before the manifest's end, or finds another
// store time).
var ErrVerify = errors.New("snapshot: staged files do not verify")

// StageOptions configure a Stage.
type StageOptions struct {
	FS vfs.FS
	// Dir is the staging directory, inside the data dir (so the install is
	// a rename): it is removed and created anew.
	Dir string
	// FileSize is the receiver's commitlog file size; the manifest's must
	// be the same.
	FileSize int64
	// MaxBytes bounds the disk the stage may take (whole files of
	// FileSize): a manifest needing more is refused before anything is
	// written. Required.
	MaxBytes int64
	// RequireCRC: every record must carry the whole-record CRC property.
	RequireCRC bool
}

// Stage receives one snapshot's files into a staging directory and
// verifies them. One goroutine uses it at a time.
type Stage struct {
	opts StageOptions
	m    Manifest

	cur     int         // index into m.Files of the file being received
	off     int64       // next offset expected in it
	crc     uint32      // running CRC of the current file
	seg     vfs.Segment // the current file, created at its first chunk
	written int64
	err     error // sticky: the first refusal
	done    bool
}

// NewStage checks m against the options and prepares an empty staging
// directory.
func NewStage(o StageOptions, m Manifest) (*Stage, error) {
	if err := m.Check(); err != nil {
		return nil, err
	}
	if m.FileSize != o.FileSize {
		return nil, fmt.Errorf("%w: file size %d, this replica's is %d", ErrBadManifest, m.FileSize, o.FileSize)
	}
	if o.MaxBytes <= 0 {
		return nil, errors.New("snapshot: StageOptions.MaxBytes is required")
	}
	if need := int64(len(m.Files)) * m.FileSize; need > o.MaxBytes {
		return nil, fmt.Errorf("%w: %d files of %d bytes, the stage may take %d", ErrBadManifest, len(m.Files), m.FileSize, o.MaxBytes)
	}
	if err := o.FS.RemoveAll(o.Dir); err != nil {
		return nil, fmt.Errorf("snapshot: clear the staging dir: %w", err)
	}
	if err := o.FS.MkdirAll(o.Dir); err != nil {
		return nil, fmt.Errorf("snapshot: create the staging dir: %w", err)
	}
	return &Stage{opts: o, m: m}, nil
}

// Manifest is the manifest being staged.
func (s *Stage) Manifest() Manifest { return s.m }

// Written is the number of file bytes staged so far.
func (s *Stage) Written() int64 { return s.written }

// Dir is the staging directory.
func (s *Stage) Dir() string { return s.opts.Dir }

// Write stages one chunk. Chunks must come in the order Read sends them:
// the next offset of the current file, or offset 0 of the next file once
// the current one is complete. The first refusal is sticky.
func (s *Stage) Write(c Chunk) error {
	if s.err != nil {
		return s.err
	}
	if err := s.write(c); err != nil {
		s.err = err
		return err
	}
	return nil
}

func (s *Stage) write(c Chunk) error {
	if s.done {
		return fmt.Errorf("%w: the stage is finished", ErrBadChunk)
	}
	if s.cur >= len(s.m.Files) {
		return fmt.Errorf("%w: file %d: every file of the manifest is complete", ErrBadChunk, c.File)
	}
	f := s.m.Files[s.cur]
	switch {
	case len(c.Data) == 0 || len(c.Data) > MaxChunkBytes:
		return fmt.Errorf("%w: %d bytes, want 1 to %d", ErrBadChunk, len(c.Data), MaxChunkBytes)
	case c.File != f.From || c.Offset != s.off:
		return fmt.Errorf("%w: file %d offset %d, want file %d offset %d", ErrBadChunk, c.File, c.Offset, f.From, s.off)
	case c.Offset+int64(len(c.Data)) > f.Size:
		return fmt.Errorf("%w: file %d: bytes [%d, %d) past the %d the manifest declares", ErrBadChunk, c.File, c.Offset, c.Offset+int64(len(c.Data)), f.Size)
	case CRC(c.Data) != c.CRC:
		return fmt.Errorf("%w: file %d offset %d: CRC %08x, the chunk says %08x", ErrBadChunk, c.File, c.Offset, CRC(c.Data), c.CRC)
	}
	if s.seg == nil {
		// Not segment.Create: it syncs the directory per file, and Finish
		// syncs it once for all of them.
		seg, err := s.opts.FS.CreateSegment(filepath.Join(s.opts.Dir, segment.FileName(f.From)), s.m.FileSize)
		if err != nil {
			return fmt.Errorf("snapshot: stage file %d: %w", f.From, base.WrapNoSpace(err))
		}
		s.seg, s.crc = seg, 0
	}
	copy(s.seg.Bytes()[c.Offset:], c.Data)
	s.crc = crc32.Update(s.crc, castagnoli, c.Data)
	s.off += int64(len(c.Data))
	s.written += int64(len(c.Data))
	if s.off < f.Size {
		return nil
	}
	if s.crc != f.CRC {
		return fmt.Errorf("%w: file %d: CRC %08x, the manifest says %08x", ErrBadChunk, f.From, s.crc, f.CRC)
	}
	if err := s.seg.Sync(0, f.Size); err != nil {
		return fmt.Errorf("snapshot: sync staged file %d: %w", f.From, err)
	}
	if err := s.seg.Close(); err != nil {
		return fmt.Errorf("snapshot: close staged file %d: %w", f.From, err)
	}
	s.seg, s.cur, s.off = nil, s.cur+1, 0
	return nil
}

// Finish requires every file complete, scans their records (the
// commitlog's recovery scan: CRCs, PHYSICALOFFSET, whole batches) from
// MinOffset, requires the scan to end exactly at End with the manifest's
// newest store time, and syncs the staging directory. The files stay in
// Dir for the install.
func (s *Stage) Finish() error {
	if s.err != nil {
		return s.err
	}
	if err := s.finish(); err != nil {
		s.err = err
		return err
	}
	s.done = true
	return nil
}

func (s *Stage) finish() error {
	if s.cur < len(s.m.Files) {
		return fmt.Errorf("%w: file %d of %d incomplete (%d bytes staged)", ErrVerify, s.cur, len(s.m.Files), s.written)
	}
	var files []*segment.File
	defer func() {
		for _, f := range files {
			f.Close()
		}
	}()
	for _, f := range s.m.Files {
		sf, err := segment.Open(s.opts.FS, filepath.Join(s.opts.Dir, segment.FileName(f.From)), f.From, s.m.FileSize)
		if err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		files = append(files, sf)
	}
	r := commitlog.Scan(files, s.m.MinOffset, s.opts.RequireCRC)
	switch {
	case r.End != s.m.End:
		return fmt.Errorf("%w: the records end at %d, the manifest says %d (%s)", ErrVerify, r.End, s.m.End, r.BadReason)
	case r.Records > 0 && r.LastTS != s.m.LastStoreTS, r.LastTS > s.m.LastStoreTS:
		return fmt.Errorf("%w: newest store time %d, the manifest says %d", ErrVerify, r.LastTS, s.m.LastStoreTS)
	}
	if err := base.SyncDir(s.opts.FS, s.opts.Dir); err != nil {
		return fmt.Errorf("snapshot: %w", err)
	}
	return nil
}

// Discard closes what is open and removes the staging directory: nothing
// outside it was touched.
func (s *Stage) Discard() error {
	var errs []error
	if s.seg != nil {
		errs = append(errs, s.seg.Close())
		s.seg = nil
	}
	if s.err == nil {
		s.err = errors.New("snapshot: discarded")
	}
	errs = append(errs, s.opts.FS.RemoveAll(s.opts.Dir))
	return errors.Join(errs...)
}

// Incoming is a snapshot being received, as the peer transport feeds it
// (server/peer's IncomingSnapshot): Write per chunk, then Finish, or
// Discard when the stream breaks or a chunk is refused.
type Incoming interface {
	Write(file, offset int64, data []byte, crc uint32) error
	Finish() error
	Discard()
}

// ErrNotInstalled: the snapshot verified, but the receiver does not install
// snapshots (a receiver that only stages, such as the peer transport's
// tests; the store installs them, storage/group_install.go); the verified
// copy was discarded. The peer service answers it UNIMPLEMENTED.
var ErrNotInstalled = errors.New("snapshot: the receiver does not install snapshots; the verified copy was discarded")
