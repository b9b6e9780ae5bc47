package record

import (
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/netip"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

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

// TagsCode is the consume-queue tags code of a TAGS value: Java's
// String.hashCode over UTF-16 code units, sign-extended. 0 for no tag.
func TagsCode(tags string) int64 {
	var h int32
	for _, r := range tags {
		h = hashRune(h, r)
	}
	return int64(h)
}

// TagsCodeBytes is TagsCode over UTF-8 bytes, without allocating: the
// dispatcher runs it for every message.
func TagsCodeBytes(tags []byte) int64 {
	var h int32
	for len(tags) > 0 {
		r, n := utf8.DecodeRune(tags)
		h = hashRune(h, r)
		tags = tags[n:]
	}
	return int64(h)
}

// hashRune folds r into a Java String.hashCode as its UTF-16 code units.
func hashRune(h int32, r rune) int32 {
	if r1, r2 := utf16.EncodeRune(r); r1 != utf8.RuneError || r2 != utf8.RuneError {
		return 31*(31*h+int32(r1)) + int32(r2)
	}
	return 31*h + int32(r)
}
