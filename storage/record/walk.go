package record

import (
	"encoding/binary"
	"hash/crc32"
)

// span is where the variable-position parts of a record lie, as walk found
// them: positions from the record's start. It holds what the layout walk
// reads in its light mode (the magic, the sysflag's host bits and the
// lengths), enough for a scan to read the few fields it needs and for
// Decode to slice its copy without walking it again.
type span struct {
	total       int
	magic       uint32
	sys         int32
	storeTSAt   int // STORETIMESTAMP; STOREHOST follows it
	reconsumeAt int // RECONSUMETIMES; PREPAREDTRANSACTIONOFFSET follows it
	bodyAt      int
	bodyLen     int
	topicAt     int
	topicLen    int
	propsAt     int // the properties run from here to total
}

// walk is the one walk over the record layout (spec §2) that Parse, Check,
// CheckFrame and Decode share: it checks the magic and every length
// against TOTALSIZE and b, the fields summing to the total size exactly,
// and says where each variable part lies. With h it also reads every field
// into h as it passes them (the full mode: Parse, Check, Decode); without,
// only the lengths, the magic and the host bits (CheckFrame, recovery's
// scan). It checks no CRC (verify does) and never panics or allocates on
// success; every error wraps ErrCorrupt and names the first length that
// does not fit, the same way in both modes. On error h is left partly
// filled: callers return a zero Header.
func walk(b []byte, h *Header) (span, error) {
	be := binary.BigEndian
	if len(b) < 8 {
		return span{}, Corrupt("%d bytes is too short for a record header", len(b))
	}
	total := int(int32(be.Uint32(b[PosTotalSize:])))
	magic := be.Uint32(b[PosMagic:])
	if magic != MagicV1 && magic != MagicV2 {
		if magic == MagicBlank {
			return span{}, Corrupt("blank record where a message was expected")
		}
		return span{}, Corrupt("bad magic code 0x%08X", magic)
	}
	if total < MinLen || total > len(b) {
		return span{}, Corrupt("total size %d out of range [%d, %d]", total, MinLen, len(b))
	}
	b = b[:total]
	s := span{total: total, magic: magic, sys: int32(be.Uint32(b[PosSysFlag:]))}
	if h != nil {
		h.Total, h.Magic, h.SysFlag = int32(total), magic, s.sys
		h.BodyCRC = be.Uint32(b[PosBodyCRC:])
		h.QueueID = int32(be.Uint32(b[PosQueueID:]))
		h.Flag = int32(be.Uint32(b[PosFlag:]))
		h.QueueOffset = int64(be.Uint64(b[PosQueueOffset:]))
		h.PhysOffset = int64(be.Uint64(b[PosPhysOffset:]))
		h.BornTS = int64(be.Uint64(b[PosBornTS:]))
		h.bornHostAt = PosBornHost
	}
	p := PosBornHost + 8
	if s.sys&FlagBornHostV6 != 0 {
		p += 12
	}
	// MinLen covers the IPv4 header; each IPv6 host adds 12 bytes.
	if p+8+8+4+8 > total {
		return span{}, Corrupt("header overruns total size %d", total)
	}
	s.storeTSAt = p
	if h != nil {
		h.StoreTS = int64(be.Uint64(b[p:]))
		h.storeHostAt = p + 8
	}
	p += 8 + 8
	if s.sys&FlagStoreHostV6 != 0 {
		p += 12
	}
	if p+4+8+4 > total {
		return span{}, Corrupt("header overruns total size %d", total)
	}
	s.reconsumeAt = p
	if h != nil {
		h.Reconsume = int32(be.Uint32(b[p:]))
		h.PreparedTx = int64(be.Uint64(b[p+4:]))
	}
	p += 4 + 8
	bodyLen := int(int32(be.Uint32(b[p:])))
	p += 4
	if bodyLen < 0 || bodyLen > total-p {
		return span{}, Corrupt("body length %d overruns total size %d", bodyLen, total)
	}
	s.bodyAt, s.bodyLen = p, bodyLen
	p += bodyLen
	var topicLen int
	if magic == MagicV2 {
		if p+2 > total {
			return span{}, Corrupt("topic length overruns record")
		}
		topicLen = int(be.Uint16(b[p:]))
		p += 2
	} else {
		if p+1 > total {
			return span{}, Corrupt("topic length overruns record")
		}
		topicLen = int(b[p])
		p++
	}
	if topicLen > total-p {
		return span{}, Corrupt("topic length %d overruns record", topicLen)
	}
	s.topicAt, s.topicLen = p, topicLen
	p += topicLen
	if p+2 > total {
		return span{}, Corrupt("properties length overruns record")
	}
	propLen := int(be.Uint16(b[p:]))
	p += 2
	if p+propLen != total {
		return span{}, Corrupt("field lengths sum to %d, total size says %d", p+propLen, total)
	}
	s.propsAt = p
	if h != nil {
		s.slices(b, h)
	}
	return s, nil
}

// slices points h's Body, Topic and Props into b at the positions s
// holds: the record walk found them in, or a copy of its bytes (Decode).
// REQUIRES: s = walk(b) or walk of the same bytes.
func (s *span) slices(b []byte, h *Header) {
	b = b[:s.total]
	h.Body = b[s.bodyAt : s.bodyAt+s.bodyLen : s.bodyAt+s.bodyLen]
	h.Topic = b[s.topicAt : s.topicAt+s.topicLen : s.topicAt+s.topicLen]
	h.Props = b[s.propsAt:s.total:s.total]
}

// verify checks the CRCs of the record s was walked from: the whole-record
// CRC when present, else the body CRC. With requireCRC a record without
// the whole-record CRC property is corrupt. REQUIRES: s = walk(b).
func verify(b []byte, s *span, requireCRC bool) error {
	total := s.total
	b = b[:total]
	// The whole-record CRC, when present, is the record's last 20 bytes.
	// When the store writes it (requireCRC), a record without it is
	// corrupt: otherwise a flipped bit in the property name would turn the
	// check off.
	hasCRC := endsWithCRC(b[s.propsAt:])
	if requireCRC && !hasCRC {
		return Corrupt("missing %s property", PropertyCRC32)
	}
	if hasCRC {
		tail := b[total-crcPropLen:]
		stored, ok := parseCRCDigits(tail[len(PropertyCRC32)+1 : len(PropertyCRC32)+11])
		if !ok {
			return Corrupt("malformed %s property", PropertyCRC32)
		}
		if got := crc32.Checksum(b[:total-crcPropLen], crcTable) & 0x7fffffff; got != stored {
			return Corrupt("record CRC %d, stored %d", got, stored)
		}
		// The record CRC covers the body and its stored CRC, both as
		// written; checking the body CRC again would only repeat the work.
		return nil
	}
	if got, want := BodyCRC(b[s.bodyAt:s.bodyAt+s.bodyLen]), binary.BigEndian.Uint32(b[PosBodyCRC:]); got != want {
		return Corrupt("body CRC %d, stored %d", got, want)
	}
	return nil
}

// Frame is what a scan of the log reads of a checked record: its length,
// where it says it lies, its store time and its properties (for the batch
// extent). CheckFrame fills it without reading the other fields.
type Frame struct {
	Total      int32
	PhysOffset int64
	StoreTS    int64
	Props      []byte // the encoded properties string; aliases the record
}

// CheckFrame is Check for readers that need only a Frame (recovery's scan,
// the boundary walk): the same walk, the same checks and errors, without
// filling a whole Header per record.
func CheckFrame(b []byte, requireCRC bool) (Frame, error) {
	s, err := walk(b, nil)
	if err != nil {
		return Frame{}, err
	}
	if err := verify(b, &s, requireCRC); err != nil {
		return Frame{}, err
	}
	be := binary.BigEndian
	b = b[:s.total]
	return Frame{
		Total:      int32(s.total),
		PhysOffset: int64(be.Uint64(b[PosPhysOffset:])),
		StoreTS:    int64(be.Uint64(b[s.storeTSAt:])),
		Props:      b[s.propsAt:s.total:s.total],
	}, nil
}

// Batch is Header.Batch for a Frame.
func (f *Frame) Batch() (count, bytes int64, ok bool, err error) { return batchOf(f.Props, f.Total) }
