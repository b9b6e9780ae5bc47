package record

import (
	"encoding/binary"
	"hash/crc32"
	"net/netip"
)

// Record layout constants (spec §2). Part of the on-disk format shared with
// RocketMQ: never change them.
const (
	MagicV1    uint32 = 0xDAA320A7 // MESSAGE_MAGIC_CODE
	MagicV2    uint32 = 0xDAA320AB // MESSAGE_MAGIC_CODE_V2: int16 topic length
	MagicBlank uint32 = 0xCBD43194 // BLANK_MAGIC_CODE: end-of-file filler

	// BlankLen is the size of the end-of-file blank record (int32 size,
	// int32 magic). Every full file ends with one.
	BlankLen = 8

	nameValueSeparator = 1
	propertySeparator  = 2

	// crcPropLen is "__CRC32#" 0x01 ten digits 0x02.
	crcPropLen = len(PropertyCRC32) + 1 + 10 + 1

	// batchDigits is the width of each number of the batch property: a
	// batch fits one commitlog file (at most 2^40 bytes, 13 digits) and
	// has fewer records than bytes.
	batchDigits = 13
	// batchPropLen is "__BATCH#" 0x01 count "," bytes 0x02.
	batchPropLen = len(PropertyBatch) + 1 + batchDigits + 1 + batchDigits + 1

	// Byte positions of the fixed fields (spec §2.1).
	PosTotalSize   = 0
	PosMagic       = 4
	PosBodyCRC     = 8
	PosQueueID     = 12
	PosFlag        = 16
	PosQueueOffset = 20
	PosPhysOffset  = 28
	PosSysFlag     = 36
	PosBornTS      = 40
	PosBornHost    = 48

	// fixedLenV4 is every fixed-size field for IPv4 hosts, without body,
	// topic and properties: 91 - 1 - 2 (the length prefixes counted below).
	fixedLenV4 = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8
	// MinLen is the smallest well-formed record: IPv4 hosts, empty body,
	// 1-byte topic, no properties.
	MinLen = fixedLenV4 + 4 + 1 + 1 + 2
)

// Fixed limits of the stored layout (spec §6).
const (
	// MaxTopicLength is the longest topic, in UTF-8 bytes, that the store
	// takes; longer topics would need the V2 record layout, which RocketMQ's
	// Go client cannot read.
	MaxTopicLength = 127
	// MaxPropertiesLength is the longest encoded properties string, including
	// the whole-record CRC property the store adds (int16 on disk).
	MaxPropertiesLength = 32767
)

var crcTable = crc32.IEEETable

// BodyCRC is RocketMQ's body CRC: CRC-32/IEEE masked to 31 bits.
func BodyCRC(b []byte) uint32 { return crc32.Checksum(b, crcTable) & 0x7fffffff }

func hostLen(a netip.AddrPort) int {
	if a.Addr().Is4() || !a.Addr().IsValid() {
		return 8
	}
	return 20
}

func putHost(dst []byte, a netip.AddrPort) int {
	ip := a.Addr()
	switch {
	case !ip.IsValid():
		clear(dst[:4])
		binary.BigEndian.PutUint32(dst[4:], 0)
		return 8
	case ip.Is4():
		b := ip.As4()
		copy(dst, b[:])
		binary.BigEndian.PutUint32(dst[4:], uint32(a.Port()))
		return 8
	default:
		b := ip.As16()
		copy(dst, b[:])
		binary.BigEndian.PutUint32(dst[16:], uint32(a.Port()))
		return 20
	}
}

func getHost(b []byte, p int, v6 bool) (netip.AddrPort, int) {
	if v6 {
		ip := netip.AddrFrom16([16]byte(b[p : p+16]))
		return netip.AddrPortFrom(ip, uint16(binary.BigEndian.Uint32(b[p+16:]))), p + 20
	}
	ip := netip.AddrFrom4([4]byte(b[p : p+4]))
	return netip.AddrPortFrom(ip, uint16(binary.BigEndian.Uint32(b[p+4:]))), p + 8
}

// PutBlank writes the end-of-file blank record: the bytes left in the file
// and the blank magic.
func PutBlank(dst []byte, remaining int) {
	binary.BigEndian.PutUint32(dst[0:], uint32(remaining))
	binary.BigEndian.PutUint32(dst[4:], MagicBlank)
}

// IsBlank reports whether b starts with an end-of-file blank record.
func IsBlank(b []byte) bool {
	return len(b) >= BlankLen && binary.BigEndian.Uint32(b[4:]) == MagicBlank
}

// HasMagic reports whether b starts with a message record's magic (V1 or
// V2): a cheap test that a record may start there, before any check.
func HasMagic(b []byte) bool {
	if len(b) < 8 {
		return false
	}
	m := binary.BigEndian.Uint32(b[PosMagic:])
	return m == MagicV1 || m == MagicV2
}

// TotalSize is the record's TOTALSIZE field. REQUIRES: len(b) >= 4.
func TotalSize(b []byte) int32 { return int32(binary.BigEndian.Uint32(b[PosTotalSize:])) }

// PhysOffset is the record's PHYSICALOFFSET field. REQUIRES: len(b) >= MinLen.
func PhysOffset(b []byte) int64 { return int64(binary.BigEndian.Uint64(b[PosPhysOffset:])) }

// StoreTimestamp is the record's STORETIMESTAMP field. REQUIRES: b holds a
// record's header (MinLen bytes, or 12 more with an IPv6 born host).
func StoreTimestamp(b []byte) int64 {
	sys := int32(binary.BigEndian.Uint32(b[PosSysFlag:]))
	p := PosBornHost + 8
	if sys&FlagBornHostV6 != 0 {
		p += 12
	}
	return int64(binary.BigEndian.Uint64(b[p:]))
}

// StoreHost is the record's STOREHOST field. REQUIRES: b holds a
// record's header (MinLen bytes, or 12 more per IPv6 host).
func StoreHost(b []byte) netip.AddrPort {
	sys := int32(binary.BigEndian.Uint32(b[PosSysFlag:]))
	p := PosBornHost + 8 + 8
	if sys&FlagBornHostV6 != 0 {
		p += 12
	}
	host, _ := getHost(b, p, sys&FlagStoreHostV6 != 0)
	return host
}

// CRCPropertyLen and BatchPropertyLen are the bytes the store's own
// properties add to a record's properties: the whole-record CRC
// ("__CRC32#" 0x01 ten digits 0x02) and a batch's extent on its first
// record.
const (
	CRCPropertyLen   = crcPropLen
	BatchPropertyLen = batchPropLen
)
