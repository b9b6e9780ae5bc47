package commitlog

import (
	"fmt"

	"github.com/storaged/storaged/storage/internal/base"
	"github.com/storaged/storaged/storage/record"
)

// PlaceAt writes data, records another log already placed, at commitlog
// offset off: a replica copying its leader's bytes (design §2.1). off must
// be the written end, or the start of the next file when the records did
// not fit the last one; then the rest of the last file gets the same
// END_OF_FILE blank Append would have written, so file ends stay identical
// on every replica. The room rule is Append's (the bytes plus a blank's
// length fit the file), so a replica accepts exactly what a leader's Append
// could have produced. The bytes are published after the copy; it returns
// whether a blank was written. Nothing is written on an error.
//
// PlaceAt does not check what the bytes say (the caller does, e.g. that
// their PHYSICALOFFSET fields equal off); it syncs nothing.
func (l *Log) PlaceAt(off int64, data []byte) (blank bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return false, base.ErrClosed
	}
	size := l.opts.FileSize
	if int64(len(data))+record.BlankLen > size-off%size {
		return false, fmt.Errorf("storage: place %d bytes at %d: they do not fit the file", len(data), off)
	}
	f := l.file
	if f == nil {
		f = l.list.Last()
		l.file = f
	}
	end := l.list.MaxOffset()
	switch {
	case off == end && f != nil && !f.Full():
	case off == end && off%size == 0:
		// The last file is full (or there is none yet): roll.
		if f, err = l.rollLocked(); err != nil {
			return false, err
		}
	case off > end && off%size == 0 && f != nil && f.End() == off:
		pos := f.Wrote()
		record.PutBlank(f.Data()[pos:], int(f.Size()-pos))
		f.Publish(f.Size())
		blank = true
		if f, err = l.rollLocked(); err != nil {
			return blank, err
		}
	default:
		return false, fmt.Errorf("storage: place at %d: the log ends at %d", off, end)
	}
	if f.From()+f.Wrote() != off {
		return blank, fmt.Errorf("storage: place at %d: the file appends go to is at %d", off, f.From()+f.Wrote())
	}
	pos := off - f.From()
	copy(f.Data()[pos:], data)
	f.Publish(pos + int64(len(data)))
	l.prepareNext(f, pos)
	return blank, nil
}
