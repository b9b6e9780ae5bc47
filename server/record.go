package server

import (
	"encoding/binary"
	"net/netip"
	"strings"
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
			case storage.PropertyCRC32, storage.PropertyBatch: // the store's own; in raw
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
		m.Raw = rec.Raw // the stored bytes, already checked by the store's read
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

// msgID is storage.MsgID with one allocation (the string) instead of three:
// it is on the put path of every call. TestMsgIDMatchesStorage pins the two
// together.
func msgID(host netip.AddrPort, offset int64) string {
	var buf [maxMsgIDLen]byte
	return string(appendMsgID(buf[:0], host, offset))
}

// msgIDs returns the msgIds of offsets (all stored with host), hex encoded
// into one string that the ids slice: two allocations for the whole batch.
func msgIDs(host netip.AddrPort, offsets []int64) []string {
	var buf [maxMsgIDLen]byte
	w := len(appendMsgID(buf[:0], host, 0)) // the same for every offset
	var sb strings.Builder
	sb.Grow(w * len(offsets))
	for _, off := range offsets {
		sb.Write(appendMsgID(buf[:0], host, off))
	}
	all := sb.String()
	ids := make([]string, len(offsets))
	for i := range ids {
		ids[i] = all[i*w : (i+1)*w]
	}
	return ids
}

// maxMsgIDLen is the length of an IPv6 msgId: 16 address, 4 port and 8
// offset bytes, hex encoded.
const maxMsgIDLen = 2 * (16 + 4 + 8)

// appendMsgID appends the msgId of offset stored with host: host address
// and port (0.0.0.0:0 without a host, IPv4-mapped addresses as IPv6, as the
// store writes them) and offset, big endian, in upper-case hex.
func appendMsgID(b []byte, host netip.AddrPort, offset int64) []byte {
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
	for _, c := range raw[:n] {
		b = append(b, hexUpper[c>>4], hexUpper[c&0xf])
	}
	return b
}
