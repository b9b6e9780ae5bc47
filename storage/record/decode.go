package record

import (
	"bytes"
	"errors"
	"fmt"
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

// Parse walks the record at the start of b (walk) and reads every field:
// the magic and every length are checked against TOTALSIZE and b, the
// fields summing to the total size exactly. It checks no CRC (see Check)
// and never panics or allocates on success; every error wraps ErrCorrupt.
func Parse(b []byte) (h Header, err error) {
	if _, err := walk(b, &h); err != nil {
		return Header{}, err
	}
	return h, nil
}

// Property finds key in the record's properties as ParseProperties reads
// them; the value aliases the record (no allocation), nil when absent.
func (h *Header) Property(key string) []byte { return propertyIn(h.Props, key) }

// Tx is the record's transaction type (sysflag bits 2-3).
func (h *Header) Tx() int32 { return h.SysFlag & TransactionMask }

// endsWithCRC reports whether a record's properties end with the
// whole-record CRC property.
func endsWithCRC(props []byte) bool {
	return len(props) >= crcPropLen && hasCRCProperty(props[len(props)-crcPropLen:])
}

// Check parses the record at the start of b (Parse) and verifies it: the
// whole-record CRC when present, else the body CRC. With requireCRC a
// record without the whole-record CRC property is corrupt. It is what
// reads and the dispatcher run on every record (recovery's scan runs
// CheckFrame, the same checks); it does not allocate on success.
func Check(b []byte, requireCRC bool) (h Header, err error) {
	s, err := walk(b, &h)
	if err != nil {
		return Header{}, err
	}
	if err := verify(b, &s, requireCRC); err != nil {
		return Header{}, err
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
func (h *Header) Batch() (count, bytes int64, ok bool, err error) { return batchOf(h.Props, h.Total) }

// batchOf is Batch for a record's properties and total size.
func batchOf(props []byte, total int32) (count, bytes int64, ok bool, err error) {
	if endsWithCRC(props) {
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
	var h Header
	s, err := walk(b, &h)
	if err != nil {
		return nil, 0, err
	}
	if err := verify(b, &s, requireCRC); err != nil {
		return nil, 0, err
	}
	// One copy, after the checks; the fixed fields were read by the walk,
	// and the slices are moved onto the copy at the offsets the walk found
	// (the bytes are the same). Body aliases it.
	raw := append([]byte(nil), b[:s.total]...)
	s.slices(raw, &h)
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
	return r, s.total, nil
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
