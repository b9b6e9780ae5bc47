package storage_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"testing"

	"github.com/apache/rocketmq-client-go/v2/primitive"

	"github.com/storaged/storaged/storage"
)

// TestRocketMQGoClientDecodes feeds the commitlog bytes storaged wrote to
// the Apache RocketMQ Go client's decoder (primitive.DecodeMessage, what a
// consumer runs on a pull response) and checks every field it reads.
func TestRocketMQGoClientDecodes(t *testing.T) {
	dir := t.TempDir()
	s, err := storage.Open(storage.Options{Dir: dir, FileSize: 1 << 20,
		StoreHost: netip.MustParseAddrPort("192.168.1.7:10911")})
	if err != nil {
		t.Fatal(err)
	}
	type sent struct {
		m   storage.Message
		res storage.AppendResult
	}
	var all []sent
	for i, body := range []string{"hello", "", "third message"} {
		m := storage.Message{Topic: "CompatTopic", QueueID: int32(i), Flag: int32(10 + i), Body: []byte(body),
			BornTimestamp: 1700000000000 + int64(i), BornHost: netip.MustParseAddrPort("10.9.8.7:40000"),
			Properties: []storage.Property{{Key: "TAGS", Value: "TagA"}, {Key: "KEYS", Value: "key1"}, {Key: "UNIQ_KEY", Value: "U" + body + "x"}}}
		res, err := s.PutMessage(context.Background(), &m)
		if err != nil {
			t.Fatal(err)
		}
		all = append(all, sent{m, res.Append})
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "commitlog", "00000000000000000000"))
	if err != nil {
		t.Fatal(err)
	}
	end := all[len(all)-1].res.NextOffset()
	msgs := primitive.DecodeMessage(data[:end])
	if len(msgs) != len(all) {
		t.Fatalf("Go client decoded %d messages, want %d", len(msgs), len(all))
	}
	for i, got := range msgs {
		want := all[i]
		if got.Topic != want.m.Topic || string(got.Body) != string(want.m.Body) || got.Flag != want.m.Flag ||
			got.Queue.QueueId != int(want.m.QueueID) || got.QueueOffset != want.res.QueueOffset ||
			got.CommitLogOffset != want.res.WroteOffset || got.StoreTimestamp != want.res.StoreTimestamp ||
			got.BornTimestamp != want.m.BornTimestamp || got.StoreSize != want.res.WroteBytes ||
			got.BodyCRC != int32(storage.BodyCRC(want.m.Body)) {
			t.Fatalf("message %d decoded as %+v", i, got)
		}
		if got.GetTags() != "TagA" || got.GetKeys() != "key1" || got.GetProperty("UNIQ_KEY") != "U"+string(want.m.Body)+"x" {
			t.Fatalf("message %d properties %v", i, got.GetProperties())
		}
		if got.GetProperty("__CRC32#") == "" {
			t.Fatalf("message %d: whole-record CRC property not visible to the client", i)
		}
		if got.OffsetMsgId != want.res.MsgID() {
			t.Fatalf("message %d offset msgId %s, want %s", i, got.OffsetMsgId, want.res.MsgID())
		}
		if got.BornHost != "10.9.8.7:40000" || got.StoreHost != "192.168.1.7:10911" {
			t.Fatalf("hosts %s %s", got.BornHost, got.StoreHost)
		}
	}
}

// TestRocketMQGoClientDecodesBatches feeds a batch's records (the first
// carrying the store's __BATCH# extent property) between two single
// messages to the Go client's decoder: every record decodes with its
// fields and the client's properties, and the extent is an ordinary
// property to it.
func TestRocketMQGoClientDecodesBatches(t *testing.T) {
	dir := t.TempDir()
	s, err := storage.Open(storage.Options{Dir: dir, FileSize: 1 << 20,
		StoreHost: netip.MustParseAddrPort("192.168.1.7:10911")})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	single := func(body string) storage.AppendResult {
		res, err := s.PutMessage(ctx, &storage.Message{Topic: "CompatBatch", Body: []byte(body),
			Properties: []storage.Property{{Key: "TAGS", Value: "S"}}})
		if err != nil {
			t.Fatal(err)
		}
		return res.Append
	}
	first := single("before")
	b := &storage.Batch{Topic: "CompatBatch", BornHost: netip.MustParseAddrPort("10.9.8.7:40000")}
	for i, body := range []string{"one", "", "three"} {
		b.Messages = append(b.Messages, storage.BatchMessage{Flag: int32(i), Body: []byte(body), BornTimestamp: 1700000000000 + int64(i),
			Properties: []storage.Property{{Key: "TAGS", Value: "B"}, {Key: "KEYS", Value: "k" + body}}})
	}
	res, err := s.PutMessages(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	last := single("after")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, "commitlog", "00000000000000000000"))
	if err != nil {
		t.Fatal(err)
	}
	msgs := primitive.DecodeMessage(data[first.WroteOffset:last.NextOffset()])
	if len(msgs) != 5 {
		t.Fatalf("Go client decoded %d messages, want 5", len(msgs))
	}
	if string(msgs[0].Body) != "before" || string(msgs[4].Body) != "after" || msgs[4].QueueOffset != 4 {
		t.Fatalf("single messages around the batch decoded as %+v, %+v", msgs[0], msgs[4])
	}
	for i, got := range msgs[1:4] {
		want := b.Messages[i]
		if string(got.Body) != string(want.Body) || got.Flag != want.Flag || got.QueueOffset != int64(1+i) ||
			got.CommitLogOffset != res.Append.Offsets[i] || got.BornTimestamp != want.BornTimestamp ||
			got.GetTags() != "B" || got.GetKeys() != "k"+string(want.Body) || got.GetProperty("__CRC32#") == "" {
			t.Fatalf("batch message %d decoded as %+v", i, got)
		}
		extent := got.GetProperty(storage.PropertyBatch)
		if i == 0 && extent != fmt.Sprintf("%013d,%013d", 3, res.Append.WroteBytes) || i > 0 && extent != "" {
			t.Fatalf("batch message %d: %s = %q", i, storage.PropertyBatch, extent)
		}
	}
}
