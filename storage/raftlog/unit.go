package raftlog

import (
	"encoding/binary"
	"errors"
	"hash/crc32"
)

// UnitSize is the size of one index unit (DLedger's INDEX_UNIT_SIZE).
const UnitSize = 32

// Kind says where an entry's payload lives.
type Kind uint8

// The kinds of entry. Only DATA has commitlog bytes; CONF and CMD payloads
// live in the meta-log; EMPTY has none (a new term's first entry).
const (
	KindNone  Kind = iota // a zeroed unit: no entry
	KindData              // pb.EntryNormal whose data are RocketMQ records
	KindEmpty             // pb.EntryNormal without data
	KindConf              // pb.EntryConfChangeV2 (or, with FlagConfV1, pb.EntryConfChange)
	KindCmd               // pb.EntryNormal with any other data: a storaged command
	kindMax
)

func (k Kind) String() string {
	switch k {
	case KindNone:
		return "NONE"
	case KindData:
		return "DATA"
	case KindEmpty:
		return "EMPTY"
	case KindConf:
		return "CONF"
	case KindCmd:
		return "CMD"
	}
	return "?"
}

// Unit flags.
const (
	// FlagBlank: an END_OF_FILE blank precedes the entry's bytes (its pos
	// is the start of a file, and the previous file was closed by a blank).
	FlagBlank uint8 = 1 << 0
	// FlagConfV1: a CONF entry of the legacy type pb.EntryConfChange.
	FlagConfV1 uint8 = 1 << 1
	flagsKnown       = FlagBlank | FlagConfV1
)

// Unit is the index unit of one raft entry (design §2.1):
//
//	+0  term    u64
//	+8  pos     i64  commitlog offset (DATA) or meta-log offset (CONF, CMD)
//	+16 len     u32  payload bytes
//	+20 kind    u8
//	+21 flags   u8
//	+22 rsv     u16  zero
//	+24 dataCRC u32  CRC-32C of the payload
//	+28 unitCRC u32  CRC-32C of bytes 0..28
//
// Big-endian, like the records. The index is implied by the position.
type Unit struct {
	Term    uint64
	Pos     int64
	Len     uint32
	Kind    Kind
	Flags   uint8
	DataCRC uint32
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// crc32c is CRC-32C, the checksum of units, payloads and HardState slots.
func crc32c(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// Errors of the unit decoder.
var (
	ErrUnitZero = errors.New("raftlog: zeroed unit")
	ErrUnitCRC  = errors.New("raftlog: unit CRC mismatch")
	ErrUnitBad  = errors.New("raftlog: unit fields out of range")
)

// Encode writes u into dst[:UnitSize].
func (u Unit) Encode(dst []byte) {
	_ = dst[UnitSize-1]
	binary.BigEndian.PutUint64(dst[0:], u.Term)
	binary.BigEndian.PutUint64(dst[8:], uint64(u.Pos))
	binary.BigEndian.PutUint32(dst[16:], u.Len)
	dst[20] = byte(u.Kind)
	dst[21] = u.Flags
	dst[22], dst[23] = 0, 0
	binary.BigEndian.PutUint32(dst[24:], u.DataCRC)
	binary.BigEndian.PutUint32(dst[28:], crc32c(dst[:28]))
}

// DecodeUnit reads the unit in b (at least UnitSize bytes): ErrUnitZero
// for an all-zero unit (never written, or truncated), ErrUnitCRC when the
// unit checksum fails, ErrUnitBad when it holds but the fields cannot be
// (unknown kind or flags, negative pos, reserved bits, a payload on an
// EMPTY entry).
func DecodeUnit(b []byte) (Unit, error) {
	if len(b) < UnitSize {
		return Unit{}, ErrUnitBad
	}
	b = b[:UnitSize]
	zero := true
	for _, c := range b {
		if c != 0 {
			zero = false
			break
		}
	}
	if zero {
		return Unit{}, ErrUnitZero
	}
	if crc32c(b[:28]) != binary.BigEndian.Uint32(b[28:]) {
		return Unit{}, ErrUnitCRC
	}
	u := Unit{
		Term: binary.BigEndian.Uint64(b[0:]), Pos: int64(binary.BigEndian.Uint64(b[8:])),
		Len: binary.BigEndian.Uint32(b[16:]), Kind: Kind(b[20]), Flags: b[21],
		DataCRC: binary.BigEndian.Uint32(b[24:]),
	}
	switch {
	case u.Kind == KindNone || u.Kind >= kindMax, u.Flags&^flagsKnown != 0, b[22] != 0 || b[23] != 0, u.Pos < 0,
		u.Kind == KindEmpty && (u.Len != 0 || u.Pos != 0 || u.DataCRC != 0),
		u.Flags&FlagBlank != 0 && u.Kind != KindData, u.Flags&FlagConfV1 != 0 && u.Kind != KindConf,
		u.Kind == KindData && u.Len == 0:
		return Unit{}, ErrUnitBad
	}
	return u, nil
}
