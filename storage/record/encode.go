package record

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"net/netip"
)

// Spec is a message prepared for encoding: validated, sized, body CRC
// computed. It is built outside the append lock; Encode runs under it and
// only fills in what depends on the position (queue offset, physical
// offset, store time) and the whole-record CRC.
type Spec struct {
	// Fields are ordered by size, not by layout, so that a batch's slice of
	// specs wastes no padding (200 bytes a spec).
	Topic      string
	Body       []byte
	Props      []Property
	BornHost   netip.AddrPort
	StoreHost  netip.AddrPort
	BornTS     int64
	PreparedTx int64
	// BatchCount and BatchBytes: see BatchFirst.
	BatchCount int
	BatchBytes int
	// Set by Size.
	PropsLen int // encoded properties including the store's own
	Total    int // whole record

	QueueID   int32
	Flag      int32
	BodyCRC   uint32 // set by the caller (BodyCRC(Body)), outside the lock
	SysFlag   int32
	Reconsume int32
	// PropCRC appends the whole-record CRC property (__CRC32#).
	PropCRC bool
	// BatchFirst marks the first record of a batch of two or more: it
	// carries PropertyBatch with BatchCount records and BatchBytes bytes
	// (every record of the batch, this one included), after the client's
	// properties and before the CRC property, so the CRC covers it.
	BatchFirst bool
	V2         bool // set by Size: topic longer than MaxTopicLength (int16 topic length)
}

// Size computes PropsLen, Total, V2 and the store-owned sysflag bits. It
// returns a *FieldError for properties that are illegal or too long.
func (r *Spec) Size() *FieldError {
	pl, ferr := PropertiesLen(r.Props)
	if ferr != nil {
		return ferr
	}
	if r.PropCRC {
		pl += crcPropLen
	}
	if r.BatchFirst {
		pl += batchPropLen
	}
	if pl > MaxPropertiesLength {
		return &FieldError{Field: "properties", TooLong: true,
			Reason: fmt.Sprintf("encoded properties are %d bytes, limit %d", pl, MaxPropertiesLength)}
	}
	r.PropsLen = pl
	r.V2 = len(r.Topic) > MaxTopicLength
	topicPrefix := 1
	if r.V2 {
		topicPrefix = 2
	}
	r.SysFlag &^= StoreOwnedSysFlags
	if hostLen(r.BornHost) == 20 {
		r.SysFlag |= FlagBornHostV6
	}
	if hostLen(r.StoreHost) == 20 {
		r.SysFlag |= FlagStoreHostV6
	}
	r.Total = fixedLenV4 - 16 + hostLen(r.BornHost) + hostLen(r.StoreHost) +
		4 + len(r.Body) + topicPrefix + len(r.Topic) + 2 + r.PropsLen
	return nil
}

// Encode writes the record into dst[:r.Total]. REQUIRES: Size was called,
// len(dst) >= r.Total.
func (r *Spec) Encode(dst []byte, queueOffset, physOffset, storeTS int64) {
	be := binary.BigEndian
	dst = dst[:r.Total]
	be.PutUint32(dst[PosTotalSize:], uint32(r.Total))
	if r.V2 {
		be.PutUint32(dst[PosMagic:], MagicV2)
	} else {
		be.PutUint32(dst[PosMagic:], MagicV1)
	}
	be.PutUint32(dst[PosBodyCRC:], r.BodyCRC)
	be.PutUint32(dst[PosQueueID:], uint32(r.QueueID))
	be.PutUint32(dst[PosFlag:], uint32(r.Flag))
	be.PutUint64(dst[PosQueueOffset:], uint64(queueOffset))
	be.PutUint64(dst[PosPhysOffset:], uint64(physOffset))
	be.PutUint32(dst[PosSysFlag:], uint32(r.SysFlag))
	be.PutUint64(dst[PosBornTS:], uint64(r.BornTS))
	p := PosBornHost
	p += putHost(dst[p:], r.BornHost)
	be.PutUint64(dst[p:], uint64(storeTS))
	p += 8
	p += putHost(dst[p:], r.StoreHost)
	be.PutUint32(dst[p:], uint32(r.Reconsume))
	p += 4
	be.PutUint64(dst[p:], uint64(r.PreparedTx))
	p += 8
	be.PutUint32(dst[p:], uint32(len(r.Body)))
	p += 4
	p += copy(dst[p:], r.Body)
	if r.V2 {
		be.PutUint16(dst[p:], uint16(len(r.Topic)))
		p += 2
	} else {
		dst[p] = byte(len(r.Topic))
		p++
	}
	p += copy(dst[p:], r.Topic)
	be.PutUint16(dst[p:], uint16(r.PropsLen))
	p += 2
	for i := range r.Props {
		p += copy(dst[p:], r.Props[i].Key)
		dst[p] = nameValueSeparator
		p++
		p += copy(dst[p:], r.Props[i].Value)
		dst[p] = propertySeparator
		p++
	}
	if r.BatchFirst {
		p += copy(dst[p:], PropertyBatch)
		dst[p] = nameValueSeparator
		p++
		putDigits(dst[p:p+batchDigits], uint64(r.BatchCount))
		p += batchDigits
		dst[p] = ','
		p++
		putDigits(dst[p:p+batchDigits], uint64(r.BatchBytes))
		p += batchDigits
		dst[p] = propertySeparator
		p++
	}
	if r.PropCRC {
		p += copy(dst[p:], PropertyCRC32)
		dst[p] = nameValueSeparator
		p++
		putCRCDigits(dst[p:p+10], crc32.Checksum(dst[:r.Total-crcPropLen], crcTable)&0x7fffffff)
		p += 10
		dst[p] = propertySeparator
	}
}

// putCRCDigits writes c as ten ASCII digits, least significant first,
// padded with '0' (MessageDecoder.createCrc32).
func putCRCDigits(dst []byte, c uint32) {
	for i := 0; i < 10; i++ {
		dst[i] = '0' + byte(c%10)
		c /= 10
	}
}

// putDigits writes n as len(dst) zero-padded decimal digits, most
// significant first.
func putDigits(dst []byte, n uint64) {
	for i := len(dst) - 1; i >= 0; i-- {
		dst[i] = '0' + byte(n%10)
		n /= 10
	}
}

// parseDigits reads the decimal digits of b, most significant first.
func parseDigits(b []byte) (int64, bool) {
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// parseCRCDigits reads the ten ASCII digits putCRCDigits writes (least
// significant first). Every record read or scanned runs it, so the digits
// are checked and combined eight at a time in a word (SWAR) rather than in
// a loop of ten compares and multiplies: recovery's scan spent about a
// twentieth of its instructions here. FuzzParseCRCDigits holds it to the
// plain loop (parseCRCDigitsLoop).
func parseCRCDigits(b []byte) (uint32, bool) {
	_ = b[9]
	// b[2:10] little-endian: byte k is the digit of weight 10^(k+2).
	w := binary.LittleEndian.Uint64(b[2:])
	const (
		ones   = 0x0101010101010101
		zeros  = 0x30 * ones
		high   = 0xF0 * ones
		sixes  = 0x06 * ones
		lowOf2 = 0x00FF00FF00FF00FF
		lowOf4 = 0x0000FFFF0000FFFF
	)
	// Every byte is in '0'..'9': its high nibble is 3, and adding 6
	// leaves it 3 (a low nibble of 10..15 would carry into it).
	if w&high != zeros || (w+sixes)&high != zeros {
		return 0, false
	}
	if b[0] < '0' || b[0] > '9' || b[1] < '0' || b[1] > '9' {
		return 0, false
	}
	w -= zeros
	w = w&lowOf2 + (w>>8)&lowOf2*10                     // pairs: two digits in each 16 bits
	w = w&lowOf4 + (w>>16)&lowOf4*100                   // four digits in each 32 bits
	w = w&0xFFFFFFFF + (w>>32)*10000                    // the eight digits
	c := w*100 + uint64(b[1]-'0')*10 + uint64(b[0]-'0') // at most 9,999,999,999: no overflow
	if c > 0x7fffffff {
		return 0, false
	}
	return uint32(c), true
}

// parseCRCDigitsLoop is parseCRCDigits written plainly, the reference its
// fuzz test holds it to.
func parseCRCDigitsLoop(b []byte) (uint32, bool) {
	var c uint64
	for i := 9; i >= 0; i-- {
		if b[i] < '0' || b[i] > '9' {
			return 0, false
		}
		c = c*10 + uint64(b[i]-'0')
	}
	if c > 0x7fffffff {
		return 0, false
	}
	return uint32(c), true
}
