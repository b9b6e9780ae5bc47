package server

import (
	"net"
	"net/netip"
	"slices"
	"testing"

	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// TestStatusTable: every storage.PutStatus maps to its own proto value,
// never UNSPECIFIED, whose name is PUT_MESSAGE_STATUS_ + the RocketMQ name;
// and every proto value but UNSPECIFIED is reached.
func TestStatusTable(t *testing.T) {
	seen := map[storagedv1.PutMessageStatus]storage.PutStatus{}
	for s := storage.PutOK; s.String() != "UNSPECIFIED"; s++ {
		p := toProtoStatus(s)
		if p == storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_UNSPECIFIED {
			t.Errorf("%v maps to UNSPECIFIED", s)
			continue
		}
		if prev, dup := seen[p]; dup {
			t.Errorf("%v and %v both map to %v", prev, s, p)
		}
		seen[p] = s
		if want := "PUT_MESSAGE_STATUS_" + s.String(); p.String() != want {
			t.Errorf("%v maps to %v, want %s", s, p, want)
		}
	}
	if want := len(storagedv1.PutMessageStatus_name) - 1; len(seen) != want {
		t.Errorf("%d storage statuses mapped, the proto has %d non-UNSPECIFIED values", len(seen), want)
	}
	if toProtoStatus(0) != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_UNSPECIFIED {
		t.Errorf("status 0 must map to UNSPECIFIED")
	}
}

func TestServiceName(t *testing.T) {
	if ServiceName != storagedv1.MessageStoreService_ServiceDesc.ServiceName {
		t.Fatalf("ServiceName %q, generated %q", ServiceName, storagedv1.MessageStoreService_ServiceDesc.ServiceName)
	}
}

func TestToMessageProperties(t *testing.T) {
	m, fe := toMessage(&storagedv1.PutMessageRequest{Message: &storagedv1.Message{
		Topic: "t", Body: []byte("b"), Tags: "tg", Keys: "k1 k2", DelayLevel: 4, WaitStoreOk: proto.Bool(false),
		Properties: map[string]string{"z": "26", "a": "1", "m": "13"},
	}}, 42, netip.AddrPort{})
	if fe != nil {
		t.Fatal(fe)
	}
	want := []storage.Property{
		{Key: "TAGS", Value: "tg"}, {Key: "KEYS", Value: "k1 k2"}, {Key: "DELAY", Value: "4"}, {Key: "WAIT", Value: "false"},
		{Key: "a", Value: "1"}, {Key: "m", Value: "13"}, {Key: "z", Value: "26"},
	}
	if !slices.Equal(m.Properties, want) {
		t.Errorf("properties %v, want %v", m.Properties, want)
	}
	if m.BornTimestamp != 42 || m.SysFlag != 0 {
		t.Errorf("born %d sysflag %d", m.BornTimestamp, m.SysFlag)
	}

	// wait_store_ok true or absent adds no WAIT; no delay adds no DELAY.
	for _, w := range []*bool{nil, proto.Bool(true)} {
		m, _ := toMessage(&storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("b"), WaitStoreOk: w}}, 0, netip.AddrPort{})
		if len(m.Properties) != 0 {
			t.Errorf("wait_store_ok %v: properties %v", w, m.Properties)
		}
	}
}

func TestBornHost(t *testing.T) {
	if got := bornHost(t.Context()); got.IsValid() {
		t.Errorf("no peer: %v", got)
	}
	mapped := &net.TCPAddr{IP: net.ParseIP("::ffff:192.0.2.7"), Port: 5555}
	if got := bornHost(peer.NewContext(t.Context(), &peer.Peer{Addr: mapped})); got != netip.MustParseAddrPort("192.0.2.7:5555") {
		t.Errorf("v4-mapped peer: %v", got)
	}
	v6 := &net.TCPAddr{IP: net.ParseIP("2001:db8::1"), Port: 7}
	if got := bornHost(peer.NewContext(t.Context(), &peer.Peer{Addr: v6})); got != netip.MustParseAddrPort("[2001:db8::1]:7") {
		t.Errorf("v6 peer: %v", got)
	}
	unix := &net.UnixAddr{Name: "/tmp/s", Net: "unix"}
	if got := bornHost(peer.NewContext(t.Context(), &peer.Peer{Addr: unix})); got.IsValid() {
		t.Errorf("unix peer: %v", got)
	}
}

// TestValidateBatchNilEntry: a nil entry cannot be sent over the wire by
// the Go client, but the validation must still not panic on one.
func TestValidateBatchNilEntry(t *testing.T) {
	fe := validateBatch(&storagedv1.PutMessagesRequest{Topic: "t", Messages: []*storagedv1.BatchEntry{{Body: []byte("b")}, nil}}, 10)
	if fe == nil || fe.Field != "messages[1]" {
		t.Fatalf("got %v, want messages[1]", fe)
	}
}

// TestToBatchProperties: each entry gets TAGS, KEYS and then its user
// properties in key order, and nothing of another entry; appending to one
// entry's properties does not touch the next one's.
func TestToBatchProperties(t *testing.T) {
	req := &storagedv1.PutMessagesRequest{Topic: "t", Messages: []*storagedv1.BatchEntry{
		{Body: []byte("0"), Tags: "tg", Keys: "k", Properties: map[string]string{"z": "26", "a": "1"}},
		{Body: []byte("1")},
		{Body: []byte("2"), Keys: "k2"},
		{Body: []byte("3"), Properties: map[string]string{"m": "13"}},
		{Body: []byte("4")},
	}}
	b, fe := toBatch(req, 42, netip.AddrPort{}, 10)
	if fe != nil {
		t.Fatal(fe)
	}
	want := [][]storage.Property{
		{{Key: "TAGS", Value: "tg"}, {Key: "KEYS", Value: "k"}, {Key: "a", Value: "1"}, {Key: "z", Value: "26"}},
		nil,
		{{Key: "KEYS", Value: "k2"}},
		{{Key: "m", Value: "13"}},
		nil,
	}
	if len(b.Messages) != len(want) {
		t.Fatalf("%d messages, want %d", len(b.Messages), len(want))
	}
	for i, m := range b.Messages {
		if !slices.Equal(m.Properties, want[i]) || string(m.Body) != string(req.Messages[i].Body) || m.BornTimestamp != 42 {
			t.Errorf("message %d: properties %v body %q born %d, want %v", i, m.Properties, m.Body, m.BornTimestamp, want[i])
		}
	}
	_ = append(b.Messages[0].Properties, storage.Property{Key: "x", Value: "y"})
	_ = append(b.Messages[2].Properties, storage.Property{Key: "x", Value: "y"})
	if !slices.Equal(b.Messages[2].Properties, want[2]) || !slices.Equal(b.Messages[3].Properties, want[3]) {
		t.Errorf("an append to one entry changed another: %v, %v", b.Messages[2].Properties, b.Messages[3].Properties)
	}
}

// TestBatchMsgIDs: a batch answer carries one msgId per offset, each the
// one msgID gives, for IPv4, IPv6 and absent store hosts.
func TestBatchMsgIDs(t *testing.T) {
	for _, host := range []netip.AddrPort{testStoreHost, netip.MustParseAddrPort("[2001:db8::1]:7"), {}} {
		a := &storage.AppendResult{StoreHost: host, WroteOffset: 100, Offsets: []int64{100, 250, 1 << 40, 0}}
		r := toPutMessagesResponse(&storage.PutResult{Status: storage.PutOK, Append: *a}).GetResult()
		if len(r.MsgIds) != len(a.Offsets) {
			t.Fatalf("%v: %d msgIds, want %d", host, len(r.MsgIds), len(a.Offsets))
		}
		for i, off := range a.Offsets {
			if want := msgID(host, off); r.MsgIds[i] != want {
				t.Errorf("%v: msgIds[%d] = %q, want %q", host, i, r.MsgIds[i], want)
			}
		}
		if r.MsgId != msgID(host, 100) {
			t.Errorf("%v: msgId %q", host, r.MsgId)
		}
	}
	one := toPutMessagesResponse(&storage.PutResult{Append: storage.AppendResult{StoreHost: testStoreHost, WroteOffset: 7}}).GetResult()
	if !slices.Equal(one.MsgIds, []string{msgID(testStoreHost, 7)}) {
		t.Errorf("no offsets: msgIds %v", one.MsgIds)
	}
}

// TestBatchPathAllocs: the edge's work on a batch does not grow with the
// number of entries: no field path, property slice or msgId string per
// entry.
func TestBatchPathAllocs(t *testing.T) {
	req := &storagedv1.PutMessagesRequest{Topic: "t"}
	res := &storage.PutResult{Status: storage.PutOK, Append: storage.AppendResult{StoreHost: testStoreHost}}
	for i := range 100 {
		req.Messages = append(req.Messages, &storagedv1.BatchEntry{Body: []byte("b")})
		res.Append.Offsets = append(res.Append.Offsets, int64(i)*1100)
	}
	for _, tc := range []struct {
		name string
		max  float64
		f    func()
	}{
		{"validateBatch", 0, func() { validateBatch(req, 1024) }},
		{"toBatch", 2, func() { toBatch(req, 1, netip.AddrPort{}, 1024) }},  // the batch and its messages
		{"toPutMessagesResponse", 4, func() { toPutMessagesResponse(res) }}, // the response, msg_id, msg_ids and their one string
	} {
		if got := testing.AllocsPerRun(10, tc.f); got > tc.max {
			t.Errorf("%s: %v allocations for 100 entries, want at most %v", tc.name, got, tc.max)
		}
	}
}
