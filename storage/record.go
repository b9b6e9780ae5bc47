package storage

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash/crc32"
	"net/netip"
	"strings"
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

	posTotalSize   = 0
	posMagic       = 4
	posBodyCRC     = 8
	posQueueID     = 12
	posFlag        = 16
	posQueueOffset = 20
	posPhysOffset  = 28
	posSysFlag     = 36
	posBornTS      = 40
	posBornHost    = 48

	// fixedLen is every fixed-size field for IPv4 hosts, without body,
	// topic and properties: 91 - 1 - 2 (the length prefixes counted below).
	fixedLenV4 = 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + 8 + 8 + 8 + 4 + 8
	// minRecordLen is the smallest well-formed record: IPv4 hosts, empty
	// body, 1-byte topic, no properties.
	minRecordLen = fixedLenV4 + 4 + 1 + 1 + 2
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

// recordSpec is a message prepared for encoding: validated, sized, body CRC
// computed. It is built outside the put lock; encode runs under it and only
// fills in what depends on the position (queue offset, physical offset,
// store time) and the whole-record CRC.
type recordSpec struct {
	topic      string
	queueID    int32
	flag       int32
	body       []byte
	bodyCRC    uint32
	props      []Property
	sysFlag    int32
	bornTS     int64
	bornHost   netip.AddrPort
	storeHost  netip.AddrPort
	reconsume  int32
	preparedTx int64
	propsLen   int // encoded properties including the CRC property
	total      int // whole record
	v2         bool
	propCRC    bool
	// batchFirst marks the first record of a batch of two or more: it
	// carries PropertyBatch with batchCount records and batchBytes bytes
	// (every record of the batch, this one included), after the client's
	// properties and before the CRC property, so the CRC covers it.
	batchFirst bool
	batchCount int
	batchBytes int
}

// size computes propsLen and total. It returns a ValidationError for
// properties too long or a record that cannot be represented.
func (r *recordSpec) size() *ValidationError {
	pl, verr := propertiesLen(r.props)
	if verr != nil {
		return verr
	}
	if r.propCRC {
		pl += crcPropLen
	}
	if r.batchFirst {
		pl += batchPropLen
	}
	if pl > MaxPropertiesLength {
		return &ValidationError{Status: PropertiesSizeExceeded, Field: "properties",
			Reason: fmt.Sprintf("encoded properties are %d bytes, limit %d", pl, MaxPropertiesLength)}
	}
	r.propsLen = pl
	r.v2 = len(r.topic) > MaxTopicLength
	topicPrefix := 1
	if r.v2 {
		topicPrefix = 2
	}
	r.sysFlag &^= storeOwnedSysFlags
	if hostLen(r.bornHost) == 20 {
		r.sysFlag |= FlagBornHostV6
	}
	if hostLen(r.storeHost) == 20 {
		r.sysFlag |= FlagStoreHostV6
	}
	r.total = fixedLenV4 - 16 + hostLen(r.bornHost) + hostLen(r.storeHost) +
		4 + len(r.body) + topicPrefix + len(r.topic) + 2 + r.propsLen
	return nil
}

// encode writes the record into dst[:r.total]. REQUIRES: len(dst) >= r.total.
func (r *recordSpec) encode(dst []byte, queueOffset, physOffset, storeTS int64) {
	be := binary.BigEndian
	dst = dst[:r.total]
	be.PutUint32(dst[posTotalSize:], uint32(r.total))
	if r.v2 {
		be.PutUint32(dst[posMagic:], MagicV2)
	} else {
		be.PutUint32(dst[posMagic:], MagicV1)
	}
	be.PutUint32(dst[posBodyCRC:], r.bodyCRC)
	be.PutUint32(dst[posQueueID:], uint32(r.queueID))
	be.PutUint32(dst[posFlag:], uint32(r.flag))
	be.PutUint64(dst[posQueueOffset:], uint64(queueOffset))
	be.PutUint64(dst[posPhysOffset:], uint64(physOffset))
	be.PutUint32(dst[posSysFlag:], uint32(r.sysFlag))
	be.PutUint64(dst[posBornTS:], uint64(r.bornTS))
	p := posBornHost
	p += putHost(dst[p:], r.bornHost)
	be.PutUint64(dst[p:], uint64(storeTS))
	p += 8
	p += putHost(dst[p:], r.storeHost)
	be.PutUint32(dst[p:], uint32(r.reconsume))
	p += 4
	be.PutUint64(dst[p:], uint64(r.preparedTx))
	p += 8
	be.PutUint32(dst[p:], uint32(len(r.body)))
	p += 4
	p += copy(dst[p:], r.body)
	if r.v2 {
		be.PutUint16(dst[p:], uint16(len(r.topic)))
		p += 2
	} else {
		dst[p] = byte(len(r.topic))
		p++
	}
	p += copy(dst[p:], r.topic)
	be.PutUint16(dst[p:], uint16(r.propsLen))
	p += 2
	for i := range r.props {
		p += copy(dst[p:], r.props[i].Key)
		dst[p] = nameValueSeparator
		p++
		p += copy(dst[p:], r.props[i].Value)
		dst[p] = propertySeparator
		p++
	}
	if r.batchFirst {
		p += copy(dst[p:], PropertyBatch)
		dst[p] = nameValueSeparator
		p++
		putDigits(dst[p:p+batchDigits], uint64(r.batchCount))
		p += batchDigits
		dst[p] = ','
		p++
		putDigits(dst[p:p+batchDigits], uint64(r.batchBytes))
		p += batchDigits
		dst[p] = propertySeparator
		p++
	}
	if r.propCRC {
		p += copy(dst[p:], PropertyCRC32)
		dst[p] = nameValueSeparator
		p++
		putCRCDigits(dst[p:p+10], crc32.Checksum(dst[:r.total-crcPropLen], crcTable)&0x7fffffff)
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

func parseCRCDigits(b []byte) (uint32, bool) {
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

// putBlank writes the end-of-file blank record: the bytes left in the file
// and the blank magic.
func putBlank(dst []byte, remaining int) {
	binary.BigEndian.PutUint32(dst[0:], uint32(remaining))
	binary.BigEndian.PutUint32(dst[4:], MagicBlank)
}

// Record is a decoded stored message. It does not alias the buffer it was
// decoded from: Raw is a copy, and Body is a slice of Raw.
type Record struct {
	TotalSize        int32
	Magic            uint32
	BodyCRC          uint32
	QueueID          int32
	Flag             int32
	QueueOffset      int64
	PhysicalOffset   int64
	SysFlag          int32
	BornTimestamp    int64
	BornHost         netip.AddrPort
	StoreTimestamp   int64
	StoreHost        netip.AddrPort
	ReconsumeTimes   int32
	PreparedTxOffset int64
	Body             []byte
	Topic            string
	// Properties in stored order, including __CRC32# when present.
	Properties []Property
	// PropertiesRaw is the stored properties string.
	PropertiesRaw string
	// HasPropCRC reports whether the record carried a whole-record CRC (it
	// was verified by Decode).
	HasPropCRC bool
	// Raw is the stored record, byte for byte (RocketMQ's layout: what a
	// pull response carries). Body aliases it.
	Raw []byte
}

// Property returns the value of the property key and whether it is set.
func (r *Record) Property(key string) (string, bool) { return lookup(r.Properties, key) }

// MsgID returns the record's offset msgId (store host, port, offset).
func (r *Record) MsgID() string { return MsgID(r.StoreHost, r.PhysicalOffset) }

// DecodeError describes why bytes are not a valid record. It wraps
// ErrCorrupt.
type DecodeError struct {
	Offset int64 // position within the decoded buffer where the record starts, or -1
	Reason string
}

func (e *DecodeError) Error() string {
	return fmt.Sprintf("storage: corrupt record: %s", e.Reason)
}

// Unwrap implements errors.Unwrap.
func (e *DecodeError) Unwrap() error { return ErrCorrupt }

func corrupt(format string, args ...any) error {
	return &DecodeError{Offset: -1, Reason: fmt.Sprintf(format, args...)}
}

// IsBlank reports whether b starts with an end-of-file blank record.
func IsBlank(b []byte) bool {
	return len(b) >= BlankLen && binary.BigEndian.Uint32(b[4:]) == MagicBlank
}

// DecodeRecord decodes the stored message at the start of b and verifies it:
// magic, size fields that agree with each other, the body CRC and, when
// present, the whole-record CRC property. It returns the record and its
// length. Any failure wraps ErrCorrupt. DecodeRecord never panics and never
// allocates more than len(b).
func DecodeRecord(b []byte) (*Record, int, error) {
	return decodeRecord(b, false)
}

// DecodeRecordStrict is DecodeRecord for stores that write the
// whole-record CRC: a record without the __CRC32# property is corrupt.
func DecodeRecordStrict(b []byte) (*Record, int, error) {
	return decodeRecord(b, true)
}

func decodeRecord(b []byte, requireCRC bool) (*Record, int, error) {
	n, err := checkRecord(b, requireCRC)
	if err != nil {
		return nil, 0, err
	}
	b = append([]byte(nil), b[:n]...) // one copy; Body aliases it
	be := binary.BigEndian
	r := &Record{
		Raw:            b,
		TotalSize:      int32(n),
		Magic:          be.Uint32(b[posMagic:]),
		BodyCRC:        be.Uint32(b[posBodyCRC:]),
		QueueID:        int32(be.Uint32(b[posQueueID:])),
		Flag:           int32(be.Uint32(b[posFlag:])),
		QueueOffset:    int64(be.Uint64(b[posQueueOffset:])),
		PhysicalOffset: int64(be.Uint64(b[posPhysOffset:])),
		SysFlag:        int32(be.Uint32(b[posSysFlag:])),
		BornTimestamp:  int64(be.Uint64(b[posBornTS:])),
	}
	p := posBornHost
	r.BornHost, p = getHost(b, p, r.SysFlag&FlagBornHostV6 != 0)
	r.StoreTimestamp = int64(be.Uint64(b[p:]))
	p += 8
	r.StoreHost, p = getHost(b, p, r.SysFlag&FlagStoreHostV6 != 0)
	r.ReconsumeTimes = int32(be.Uint32(b[p:]))
	p += 4
	r.PreparedTxOffset = int64(be.Uint64(b[p:]))
	p += 8
	bodyLen := int(be.Uint32(b[p:]))
	p += 4
	r.Body = b[p : p+bodyLen : p+bodyLen]
	p += bodyLen
	var topicLen int
	if r.Magic == MagicV2 {
		topicLen = int(be.Uint16(b[p:]))
		p += 2
	} else {
		topicLen = int(b[p])
		p++
	}
	r.Topic = string(b[p : p+topicLen])
	p += topicLen
	propLen := int(be.Uint16(b[p:]))
	p += 2
	r.PropertiesRaw = string(b[p : p+propLen])
	r.Properties = parseProperties(r.PropertiesRaw)
	_, r.HasPropCRC = r.Property(PropertyCRC32)
	return r, n, nil
}

func getHost(b []byte, p int, v6 bool) (netip.AddrPort, int) {
	if v6 {
		ip := netip.AddrFrom16([16]byte(b[p : p+16]))
		return netip.AddrPortFrom(ip, uint16(binary.BigEndian.Uint32(b[p+16:]))), p + 20
	}
	ip := netip.AddrFrom4([4]byte(b[p : p+4]))
	return netip.AddrPortFrom(ip, uint16(binary.BigEndian.Uint32(b[p+4:]))), p + 8
}

// checkRecord validates the record at the start of b without allocating and
// returns its length. It is what recovery and reads run on every record.
// With requireCRC a record without the whole-record CRC property is corrupt.
func checkRecord(b []byte, requireCRC bool) (int, error) {
	be := binary.BigEndian
	if len(b) < 8 {
		return 0, corrupt("%d bytes is too short for a record header", len(b))
	}
	total := int(int32(be.Uint32(b[posTotalSize:])))
	magic := be.Uint32(b[posMagic:])
	if magic != MagicV1 && magic != MagicV2 {
		if magic == MagicBlank {
			return 0, corrupt("blank record where a message was expected")
		}
		return 0, corrupt("bad magic code 0x%08X", magic)
	}
	if total < minRecordLen || total > len(b) {
		return 0, corrupt("total size %d out of range [%d, %d]", total, minRecordLen, len(b))
	}
	b = b[:total]
	sys := int32(be.Uint32(b[posSysFlag:]))
	p := posBornHost + 8
	if sys&FlagBornHostV6 != 0 {
		p += 12
	}
	p += 8 // store timestamp
	p += 8
	if sys&FlagStoreHostV6 != 0 {
		p += 12
	}
	p += 4 + 8 // reconsume, prepared tx
	if p+4 > total {
		return 0, corrupt("header overruns total size %d", total)
	}
	bodyLen := int(int32(be.Uint32(b[p:])))
	p += 4
	if bodyLen < 0 || bodyLen > total-p {
		return 0, corrupt("body length %d overruns total size %d", bodyLen, total)
	}
	body := b[p : p+bodyLen]
	p += bodyLen
	var topicLen int
	if magic == MagicV2 {
		if p+2 > total {
			return 0, corrupt("topic length overruns record")
		}
		topicLen = int(be.Uint16(b[p:]))
		p += 2
	} else {
		if p+1 > total {
			return 0, corrupt("topic length overruns record")
		}
		topicLen = int(b[p])
		p++
	}
	if topicLen > total-p {
		return 0, corrupt("topic length %d overruns record", topicLen)
	}
	p += topicLen
	if p+2 > total {
		return 0, corrupt("properties length overruns record")
	}
	propLen := int(be.Uint16(b[p:]))
	p += 2
	if p+propLen != total {
		return 0, corrupt("field lengths sum to %d, total size says %d", p+propLen, total)
	}
	// The whole-record CRC, when present, is the record's last 20 bytes.
	// When the store writes it (requireCRC), a record without it is
	// corrupt: otherwise a flipped bit in the property name would turn the
	// check off.
	hasCRC := propLen >= crcPropLen && hasCRCProperty(b[total-crcPropLen:])
	if requireCRC && !hasCRC {
		return 0, corrupt("missing %s property", PropertyCRC32)
	}
	if hasCRC {
		tail := b[total-crcPropLen:]
		stored, ok := parseCRCDigits(tail[len(PropertyCRC32)+1 : len(PropertyCRC32)+11])
		if !ok {
			return 0, corrupt("malformed %s property", PropertyCRC32)
		}
		if got := crc32.Checksum(b[:total-crcPropLen], crcTable) & 0x7fffffff; got != stored {
			return 0, corrupt("record CRC %d, stored %d", got, stored)
		}
		// The record CRC covers the body and its stored CRC, both as
		// written; checking the body CRC again would only repeat the work.
		return total, nil
	}
	if got, want := BodyCRC(body), be.Uint32(b[posBodyCRC:]); got != want {
		return 0, corrupt("body CRC %d, stored %d", got, want)
	}
	return total, nil
}

// batchOf returns the extent a record carries in PropertyBatch: the
// record count and byte length of the batch it starts, or ok false for a
// record that starts no batch. REQUIRES: b[:total] passed checkRecord.
// The property is recognised only as a whole entry (after the start of the
// properties or a 0x02) right before the CRC property (or at the end
// without one); clients cannot set the key, and no key or value holds a
// separator, so a client's property never looks like it. A property that
// is there but malformed is an error: with the whole-record CRC on, the
// record was written that way, which the store never does.
func batchOf(b []byte, total int) (count, bytes int64, ok bool, err error) {
	props := propertiesOf(b[:total])
	if len(props) >= crcPropLen && hasCRCProperty(props[len(props)-crcPropLen:]) {
		props = props[:len(props)-crcPropLen]
	}
	if len(props) < batchPropLen {
		return 0, 0, false, nil
	}
	e := props[len(props)-batchPropLen:]
	if string(e[:len(PropertyBatch)]) != PropertyBatch || e[len(PropertyBatch)] != nameValueSeparator ||
		e[batchPropLen-1] != propertySeparator {
		return 0, 0, false, nil
	}
	if len(props) > batchPropLen && props[len(props)-batchPropLen-1] != propertySeparator {
		return 0, 0, false, nil // the tail of a longer key
	}
	v := e[len(PropertyBatch)+1 : batchPropLen-1]
	c, okc := parseDigits(v[:batchDigits])
	n, okn := parseDigits(v[batchDigits+1:])
	if !okc || !okn || v[batchDigits] != ',' || c < 1 || n < int64(total) {
		return 0, 0, false, corrupt("malformed %s property %q", PropertyBatch, v)
	}
	return c, n, true, nil
}

// propertiesOf returns the stored properties of a record that passed
// checkRecord.
func propertiesOf(b []byte) []byte {
	be := binary.BigEndian
	sys := int32(be.Uint32(b[posSysFlag:]))
	p := posBornHost + 8 + 8 + 8
	if sys&FlagBornHostV6 != 0 {
		p += 12
	}
	if sys&FlagStoreHostV6 != 0 {
		p += 12
	}
	p += 4 + 8
	p += 4 + int(be.Uint32(b[p:]))
	if be.Uint32(b[posMagic:]) == MagicV2 {
		p += 2 + int(be.Uint16(b[p:]))
	} else {
		p += 1 + int(b[p])
	}
	return b[p+2:]
}

func hasCRCProperty(tail []byte) bool {
	return string(tail[:len(PropertyCRC32)]) == PropertyCRC32 && tail[len(PropertyCRC32)] == nameValueSeparator &&
		tail[crcPropLen-1] == propertySeparator
}

// parseProperties splits "k\x01v\x02…" the way RocketMQ's
// string2messageProperties does: entries that do not split into a non-empty
// key and value are dropped.
func parseProperties(s string) []Property {
	if s == "" {
		return nil
	}
	out := make([]Property, 0, strings.Count(s, "\x02")+1)
	for s != "" {
		item := s
		if i := strings.IndexByte(s, propertySeparator); i >= 0 {
			item, s = s[:i], s[i+1:]
		} else {
			s = ""
		}
		k, v, ok := strings.Cut(item, "\x01")
		if !ok || k == "" || v == "" || strings.IndexByte(v, nameValueSeparator) >= 0 {
			continue
		}
		out = append(out, Property{Key: k, Value: v})
	}
	return out
}

// MsgID builds RocketMQ's offset msgId: upper-case hex of the store IP (4
// or 16 bytes), the port as int32 and the commitlog offset as int64, all
// big-endian. 32 characters for IPv4.
func MsgID(host netip.AddrPort, offset int64) string {
	var buf [28]byte
	n := putHost(buf[:], host)
	binary.BigEndian.PutUint64(buf[n:], uint64(offset))
	return strings.ToUpper(hex.EncodeToString(buf[:n+8]))
}

// ParseMsgID decodes an offset msgId into its store host and offset.
func ParseMsgID(id string) (netip.AddrPort, int64, error) {
	if len(id) != 32 && len(id) != 56 {
		return netip.AddrPort{}, 0, fmt.Errorf("storage: msgId %q: want 32 or 56 hex characters", id)
	}
	b, err := hex.DecodeString(id)
	if err != nil {
		return netip.AddrPort{}, 0, fmt.Errorf("storage: msgId %q: %w", id, err)
	}
	host, p := getHost(b, 0, len(b) == 28)
	return host, int64(binary.BigEndian.Uint64(b[p:])), nil
}
