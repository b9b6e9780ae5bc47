package server

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// toStoredMessage converts a record read from the store. With raw it also
// carries the record's bytes (see encodeRecord).
func toStoredMessage(rec *storage.Record, raw bool) (*storagedv1.StoredMessage, error) {
	m := &storagedv1.StoredMessage{
		Topic:           rec.Topic,
		QueueId:         rec.QueueID,
		QueueOffset:     rec.QueueOffset,
		CommitLogOffset: rec.PhysicalOffset,
		MsgId:           msgID(rec.StoreHost, rec.PhysicalOffset),
		Body:            rec.Body,
		Flag:            rec.Flag,
		BornTimestamp:   timestamppb.New(time.UnixMilli(rec.BornTimestamp)),
		StoreTimestamp:  timestamppb.New(time.UnixMilli(rec.StoreTimestamp)),
		BornHost:        hostString(rec.BornHost),
		StoreHost:       hostString(rec.StoreHost),
		SysFlag:         rec.SysFlag,
		ReconsumeTimes:  rec.ReconsumeTimes,
		StoreSize:       rec.TotalSize,
		BodyCrc:         rec.BodyCRC,
	}
	if len(rec.Properties) > 0 {
		m.Properties = make(map[string]string, len(rec.Properties))
		for _, p := range rec.Properties {
			switch p.Key {
			case storage.PropertyCRC32:
				continue
			case storage.PropertyTags:
				m.Tags = p.Value
			case storage.PropertyKeys:
				m.Keys = p.Value
			}
			m.Properties[p.Key] = p.Value
		}
	}
	if raw {
		b, err := encodeRecord(rec)
		if err != nil {
			return nil, err
		}
		m.Raw = b
	}
	return m, nil
}

// hostString is "ip:port" ("[ip]:port" for IPv6).
func hostString(a netip.AddrPort) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}

// encodeRecord rebuilds the bytes of a decoded record exactly as they are in
// the commitlog (RocketMQ CommitLog layout, storage/doc.go): decoding keeps
// every field, including the magic code, the host widths (SYSFLAG) and the
// properties string as stored. The result is checked before it is returned:
// its length must be TOTALSIZE and it must decode again, which verifies the
// body CRC and, when the record has one, the whole-record CRC against the
// checksum stored in the record itself. A mismatch is an error wrapping
// storage.ErrCorrupt: the client never gets bytes that differ from the log.
//
// storage exposes no raw read yet; once it does, this goes away.
func encodeRecord(r *storage.Record) ([]byte, error) {
	v2 := r.Magic == storage.MagicV2
	topicPrefix := 1
	if v2 {
		topicPrefix = 2
	}
	bornV6 := r.SysFlag&storage.FlagBornHostV6 != 0
	storeV6 := r.SysFlag&storage.FlagStoreHostV6 != 0
	size := 4 + 4 + 4 + 4 + 4 + 8 + 8 + 4 + 8 + hostWidth(bornV6) + 8 + hostWidth(storeV6) + 4 + 8 +
		4 + len(r.Body) + topicPrefix + len(r.Topic) + 2 + len(r.PropertiesRaw)
	if size != int(r.TotalSize) {
		return nil, fmt.Errorf("%w: record at commitlog offset %d re-encodes to %d bytes, TOTALSIZE says %d",
			storage.ErrCorrupt, r.PhysicalOffset, size, r.TotalSize)
	}
	be := binary.BigEndian
	b := make([]byte, 0, size)
	b = be.AppendUint32(b, uint32(r.TotalSize))
	b = be.AppendUint32(b, r.Magic)
	b = be.AppendUint32(b, r.BodyCRC)
	b = be.AppendUint32(b, uint32(r.QueueID))
	b = be.AppendUint32(b, uint32(r.Flag))
	b = be.AppendUint64(b, uint64(r.QueueOffset))
	b = be.AppendUint64(b, uint64(r.PhysicalOffset))
	b = be.AppendUint32(b, uint32(r.SysFlag))
	b = be.AppendUint64(b, uint64(r.BornTimestamp))
	b = appendHost(b, r.BornHost, bornV6)
	b = be.AppendUint64(b, uint64(r.StoreTimestamp))
	b = appendHost(b, r.StoreHost, storeV6)
	b = be.AppendUint32(b, uint32(r.ReconsumeTimes))
	b = be.AppendUint64(b, uint64(r.PreparedTxOffset))
	b = be.AppendUint32(b, uint32(len(r.Body)))
	b = append(b, r.Body...)
	if v2 {
		b = be.AppendUint16(b, uint16(len(r.Topic)))
	} else {
		b = append(b, byte(len(r.Topic)))
	}
	b = append(b, r.Topic...)
	b = be.AppendUint16(b, uint16(len(r.PropertiesRaw)))
	b = append(b, r.PropertiesRaw...)

	check, n, err := storage.DecodeRecord(b)
	switch {
	case err != nil:
		return nil, fmt.Errorf("record at commitlog offset %d re-encodes to bytes that fail their checks: %w", r.PhysicalOffset, err)
	case n != size || check.HasPropCRC != r.HasPropCRC || check.PhysicalOffset != r.PhysicalOffset:
		return nil, fmt.Errorf("%w: record at commitlog offset %d does not re-encode to itself", storage.ErrCorrupt, r.PhysicalOffset)
	}
	return b, nil
}

func hostWidth(v6 bool) int {
	if v6 {
		return 20
	}
	return 8
}

// appendHost appends a RocketMQ host: 4 (or 16) address bytes and the port
// as an int32.
func appendHost(b []byte, a netip.AddrPort, v6 bool) []byte {
	if v6 {
		ip := a.Addr().As16()
		b = append(b, ip[:]...)
	} else {
		ip := a.Addr().Unmap().As4()
		b = append(b, ip[:]...)
	}
	return binary.BigEndian.AppendUint32(b, uint32(a.Port()))
}

// msgID is storage.MsgID with one allocation (the string) instead of three:
// it is on the put path of every call. TestMsgIDMatchesStorage pins the two
// together.
func msgID(host netip.AddrPort, offset int64) string {
	const hexUpper = "0123456789ABCDEF"
	var raw [28]byte
	n := 0
	switch ip := host.Addr(); {
	case !ip.IsValid(): // 0.0.0.0:0, as the store writes it
		n = 8
	case ip.Is4():
		a := ip.As4()
		n = copy(raw[:], a[:])
		binary.BigEndian.PutUint32(raw[n:], uint32(host.Port()))
		n += 4
	default: // IPv6, IPv4-mapped included (the store writes 16 bytes)
		a := ip.As16()
		n = copy(raw[:], a[:])
		binary.BigEndian.PutUint32(raw[n:], uint32(host.Port()))
		n += 4
	}
	binary.BigEndian.PutUint64(raw[n:], uint64(offset))
	n += 8
	var out [56]byte
	for i := 0; i < n; i++ {
		out[2*i] = hexUpper[raw[i]>>4]
		out[2*i+1] = hexUpper[raw[i]&0xf]
	}
	return string(out[:2*n])
}
