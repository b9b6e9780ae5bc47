package record

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"net/netip"
	"strings"
)

// ErrCorrupt marks bytes that fail a record's checks (magic, length, CRC,
// offset). It is a marker: the wrapping error names file and offset. The
// storage package exports the same value as storage.ErrCorrupt.
var ErrCorrupt = errors.New("storage: corrupt record")

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

// Corrupt returns a *DecodeError with a formatted reason.
func Corrupt(format string, args ...any) error {
	return &DecodeError{Offset: -1, Reason: fmt.Sprintf(format, args...)}
}

// Header locates a record's fields in place: the slices alias the bytes
// it was parsed from. It is the one walk over the layout that every reader
// of records shares (the dispatcher, the tag-filter check, recovery,
// Decode), so a length is checked the same way everywhere.
type Header struct {
	Total       int32
	Magic       uint32
	BodyCRC     uint32
	QueueID     int32
	Flag        int32
	QueueOffset int64
	PhysOffset  int64
	SysFlag     int32
	BornTS      int64
	StoreTS     int64
	Reconsume   int32
	PreparedTx  int64
	Body        []byte
	Topic       []byte
	Props       []byte // the encoded properties string

	bornHostAt, storeHostAt int
}

// Parse walks the record at the start of b and checks every length against
// TOTALSIZE and b: the magic, the fields summing to the total size exactly.
// It checks no CRC (see Check) and never panics or allocates on success;
// every error wraps ErrCorrupt.
func Parse(b []byte) (Header, error) {
	be := binary.BigEndian
	if len(b) < 8 {
		return Header{}, Corrupt("%d bytes is too short for a record header", len(b))
	}
	total := int(int32(be.Uint32(b[PosTotalSize:])))
	magic := be.Uint32(b[PosMagic:])
	if magic != MagicV1 && magic != MagicV2 {
		if magic == MagicBlank {
			return Header{}, Corrupt("blank record where a message was expected")
		}
		return Header{}, Corrupt("bad magic code 0x%08X", magic)
	}
	if total < MinLen || total > len(b) {
		return Header{}, Corrupt("total size %d out of range [%d, %d]", total, MinLen, len(b))
	}
	b = b[:total]
	h := Header{
		Total: int32(total), Magic: magic,
		BodyCRC:     be.Uint32(b[PosBodyCRC:]),
		QueueID:     int32(be.Uint32(b[PosQueueID:])),
		Flag:        int32(be.Uint32(b[PosFlag:])),
		QueueOffset: int64(be.Uint64(b[PosQueueOffset:])),
		PhysOffset:  int64(be.Uint64(b[PosPhysOffset:])),
		SysFlag:     int32(be.Uint32(b[PosSysFlag:])),
		BornTS:      int64(be.Uint64(b[PosBornTS:])),
		bornHostAt:  PosBornHost,
	}
	p := PosBornHost + 8
	if h.SysFlag&FlagBornHostV6 != 0 {
		p += 12
	}
	// MinLen covers the IPv4 header; each IPv6 host adds 12 bytes.
	if p+8+8+4+8 > total {
		return Header{}, Corrupt("header overruns total size %d", total)
	}
	h.StoreTS = int64(be.Uint64(b[p:]))
	p += 8
	h.storeHostAt = p
	p += 8
	if h.SysFlag&FlagStoreHostV6 != 0 {
		p += 12
	}
	if p+4+8+4 > total {
		return Header{}, Corrupt("header overruns total size %d", total)
	}
	h.Reconsume = int32(be.Uint32(b[p:]))
	p += 4
	h.PreparedTx = int64(be.Uint64(b[p:]))
	p += 8
	bodyLen := int(int32(be.Uint32(b[p:])))
	p += 4
	if bodyLen < 0 || bodyLen > total-p {
		return Header{}, Corrupt("body length %d overruns total size %d", bodyLen, total)
	}
	h.Body = b[p : p+bodyLen : p+bodyLen]
	p += bodyLen
	var topicLen int
	if magic == MagicV2 {
		if p+2 > total {
			return Header{}, Corrupt("topic length overruns record")
		}
		topicLen = int(be.Uint16(b[p:]))
		p += 2
	} else {
		if p+1 > total {
			return Header{}, Corrupt("topic length overruns record")
		}
		topicLen = int(b[p])
		p++
	}
	if topicLen > total-p {
		return Header{}, Corrupt("topic length %d overruns record", topicLen)
	}
	h.Topic = b[p : p+topicLen : p+topicLen]
	p += topicLen
	if p+2 > total {
		return Header{}, Corrupt("properties length overruns record")
	}
	propLen := int(be.Uint16(b[p:]))
	p += 2
	if p+propLen != total {
		return Header{}, Corrupt("field lengths sum to %d, total size says %d", p+propLen, total)
	}
	h.Props = b[p:total:total]
	return h, nil
}

// Property finds key in the record's properties as ParseProperties reads
// them; the value aliases the record (no allocation), nil when absent.
func (h *Header) Property(key string) []byte { return propertyIn(h.Props, key) }

// Tx is the record's transaction type (sysflag bits 2-3).
func (h *Header) Tx() int32 { return h.SysFlag & TransactionMask }

// hasCRC reports whether the record ends with a whole-record CRC property.
func (h *Header) hasCRC() bool {
	return len(h.Props) >= crcPropLen && hasCRCProperty(h.Props[len(h.Props)-crcPropLen:])
}

// Check parses the record at the start of b (Parse) and verifies it: the
// whole-record CRC when present, else the body CRC. With requireCRC a
// record without the whole-record CRC property is corrupt. It is what
// recovery and reads run on every record; it does not allocate on success.
func Check(b []byte, requireCRC bool) (Header, error) {
	h, err := Parse(b)
	if err != nil {
		return Header{}, err
	}
	// The whole-record CRC, when present, is the record's last 20 bytes.
	// When the store writes it (requireCRC), a record without it is
	// corrupt: otherwise a flipped bit in the property name would turn the
	// check off.
	hasCRC := h.hasCRC()
	if requireCRC && !hasCRC {
		return Header{}, Corrupt("missing %s property", PropertyCRC32)
	}
	total := int(h.Total)
	if hasCRC {
		tail := b[total-crcPropLen : total]
		stored, ok := parseCRCDigits(tail[len(PropertyCRC32)+1 : len(PropertyCRC32)+11])
		if !ok {
			return Header{}, Corrupt("malformed %s property", PropertyCRC32)
		}
		if got := crc32.Checksum(b[:total-crcPropLen], crcTable) & 0x7fffffff; got != stored {
			return Header{}, Corrupt("record CRC %d, stored %d", got, stored)
		}
		// The record CRC covers the body and its stored CRC, both as
		// written; checking the body CRC again would only repeat the work.
		return h, nil
	}
	if got := BodyCRC(h.Body); got != h.BodyCRC {
		return Header{}, Corrupt("body CRC %d, stored %d", got, h.BodyCRC)
	}
	return h, nil
}

// Batch returns the extent the record carries in PropertyBatch: the record
// count and byte length of the batch it starts, or ok false for a record
// that starts no batch. The property is recognised only as a whole entry
// (after the start of the properties or a 0x02) right before the CRC
// property (or at the end without one); clients cannot set the key, and no
// key or value holds a separator, so a client's property never looks like
// it. A property that is there but malformed is an error: with the
// whole-record CRC on, the record was written that way, which the store
// never does.
func (h *Header) Batch() (count, bytes int64, ok bool, err error) {
	props := h.Props
	if h.hasCRC() {
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
	if !okc || !okn || v[batchDigits] != ',' || c < 1 || n < int64(h.Total) {
		return 0, 0, false, Corrupt("malformed %s property %q", PropertyBatch, v)
	}
	return c, n, true, nil
}

func hasCRCProperty(tail []byte) bool {
	return string(tail[:len(PropertyCRC32)]) == PropertyCRC32 && tail[len(PropertyCRC32)] == nameValueSeparator &&
		tail[crcPropLen-1] == propertySeparator
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
func (r *Record) Property(key string) (string, bool) { return Lookup(r.Properties, key) }

// MsgID returns the record's offset msgId (store host, port, offset).
func (r *Record) MsgID() string { return MsgID(r.StoreHost, r.PhysicalOffset) }

// Decode decodes the stored message at the start of b and verifies it:
// magic, size fields that agree with each other, the body CRC and, when
// present, the whole-record CRC property. It returns the record and its
// length. Any failure wraps ErrCorrupt. Decode never panics and never
// allocates more than len(b).
func Decode(b []byte) (*Record, int, error) { return decode(b, false) }

// DecodeStrict is Decode for stores that write the whole-record CRC: a
// record without the __CRC32# property is corrupt.
func DecodeStrict(b []byte) (*Record, int, error) { return decode(b, true) }

// DecodeChecked is Decode or DecodeStrict as requireCRC says.
func DecodeChecked(b []byte, requireCRC bool) (*Record, int, error) { return decode(b, requireCRC) }

func decode(b []byte, requireCRC bool) (*Record, int, error) {
	h, err := Check(b, requireCRC)
	if err != nil {
		return nil, 0, err
	}
	n := int(h.Total)
	raw := append([]byte(nil), b[:n]...) // one copy; Body aliases it
	h, _ = Parse(raw)                    // cannot fail: the same bytes passed
	r := &Record{
		Raw: raw, TotalSize: h.Total, Magic: h.Magic, BodyCRC: h.BodyCRC, QueueID: h.QueueID, Flag: h.Flag,
		QueueOffset: h.QueueOffset, PhysicalOffset: h.PhysOffset, SysFlag: h.SysFlag, BornTimestamp: h.BornTS,
		StoreTimestamp: h.StoreTS, ReconsumeTimes: h.Reconsume, PreparedTxOffset: h.PreparedTx,
		Body: h.Body, Topic: string(h.Topic), PropertiesRaw: string(h.Props),
	}
	r.BornHost, _ = getHost(raw, h.bornHostAt, h.SysFlag&FlagBornHostV6 != 0)
	r.StoreHost, _ = getHost(raw, h.storeHostAt, h.SysFlag&FlagStoreHostV6 != 0)
	r.Properties = ParseProperties(r.PropertiesRaw)
	_, r.HasPropCRC = r.Property(PropertyCRC32)
	return r, n, nil
}

// ParseProperties splits "k\x01v\x02…" the way RocketMQ's
// string2messageProperties does: entries that do not split into a non-empty
// key and value are dropped.
func ParseProperties(s string) []Property {
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

// propertyIn finds key in an encoded properties string as ParseProperties
// reads it; the value aliases props (no allocation).
func propertyIn(props []byte, key string) []byte {
	for len(props) > 0 {
		end := bytes.IndexByte(props, propertySeparator)
		if end < 0 {
			end = len(props)
		}
		item := props[:end]
		if len(item) > len(key) && item[len(key)] == nameValueSeparator && string(item[:len(key)]) == key {
			// As ParseProperties: an item whose value holds another
			// separator is not a property (FuzzParseMeta found it).
			if v := item[len(key)+1:]; bytes.IndexByte(v, nameValueSeparator) < 0 {
				return v
			}
		}
		if end == len(props) {
			break
		}
		props = props[end+1:]
	}
	return nil
}
