package server

import (
	"encoding/binary"
	"hash/crc32"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// TestGetMessageInsideBodyIsNotFound is the forge repro of issue 11 through
// the gRPC API: a client stores a message whose body is a well-formed
// record (topic "forge", queue offset 4242, its physical offset where the
// body lands, valid CRCs). GetMessage at that offset, by offset or by
// msgId, is NOT_FOUND (NO_RECORD_AT_OFFSET), never the forged record.
func TestGetMessageInsideBodyIsNotFound(t *testing.T) {
	client, _, _ := storeServer(t, func(o *storage.Options) { o.FileSize = 1 << 20; o.MaxMessageSize = 64 << 10 })
	ctx := ctxT(t)
	put := func(body []byte) *storagedv1.AppendResult {
		t.Helper()
		res, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "forge", Body: body}})
		if err != nil {
			t.Fatal(err)
		}
		return res.GetResult()
	}
	probe := put([]byte("probe"))
	var tmpl *storagedv1.StoredMessage
	for tmpl == nil { // the probe becomes readable through its queue
		res, err := client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: "forge", IncludeRaw: true,
			Wait: durationpb.New(5 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.GetMessages()) > 0 {
			tmpl = res.GetMessages()[0]
		}
	}
	carrierAt := probe.GetWroteOffset() + int64(probe.GetWroteBytes())
	bodyAt := carrierAt + 88 // IPv4 born and store hosts: the body follows 88 bytes of header
	forged := append([]byte(nil), tmpl.GetRaw()...)
	binary.BigEndian.PutUint64(forged[20:], 4242)
	binary.BigEndian.PutUint64(forged[28:], uint64(bodyAt))
	crc := crc32.ChecksumIEEE(forged[:len(forged)-20]) & 0x7fffffff // the __CRC32# property: ten digits, least significant first
	for i := 0; i < 10; i++ {
		forged[len(forged)-11+i] = '0' + byte(crc%10)
		crc /= 10
	}
	if _, _, err := storage.DecodeRecordStrict(forged); err != nil {
		t.Fatalf("the forged record does not pass the checks: %v", err)
	}
	carrier := put(forged)
	if carrier.GetWroteOffset() != carrierAt {
		t.Fatalf("carrier at %d, want %d", carrier.GetWroteOffset(), carrierAt)
	}
	for next := int64(1); next < 2; {
		res, err := client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: "forge", QueueOffset: next,
			Wait: durationpb.New(5 * time.Second)})
		if err != nil {
			t.Fatal(err)
		}
		next = res.GetNextOffset()
	}
	for name, req := range map[string]*storagedv1.GetMessageRequest{
		"offset": {Locator: &storagedv1.GetMessageRequest_CommitLogOffset{CommitLogOffset: bodyAt}},
		"msg_id": {Locator: &storagedv1.GetMessageRequest_MsgId{MsgId: storage.MsgID(testStoreHost, bodyAt)}},
	} {
		resp, err := client.GetMessage(ctx, req)
		if err == nil {
			t.Fatalf("by %s: served %s/%d offset %d, want NOT_FOUND", name, resp.GetMessage().GetTopic(),
				resp.GetMessage().GetQueueId(), resp.GetMessage().GetQueueOffset())
		}
		details(t, err).want(t, codes.NotFound, ReasonNoRecord, false)
	}
	resp, err := client.GetMessage(ctx, &storagedv1.GetMessageRequest{Locator: &storagedv1.GetMessageRequest_MsgId{MsgId: carrier.GetMsgId()}})
	if err != nil || string(resp.GetMessage().GetBody()) != string(forged) {
		t.Fatalf("the carrier itself: %v", err)
	}
}
