package server

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"google.golang.org/grpc/codes"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// TestPutThenReadOverGRPC: once PutMessage or PutMessages answers, in
// either flush mode, GetQueueInfo covers the message and a pull at its
// queue offset returns it, for a topic that did not exist before, with
// several producers at once. (Before: NOT_FOUND "no message was ever
// stored" or max_offset 0 for tens of ms after the answer.)
func TestPutThenReadOverGRPC(t *testing.T) {
	for _, mode := range []storage.FlushMode{storage.FlushAsync, storage.FlushSync} {
		t.Run(mode.String(), func(t *testing.T) {
			client, _, _ := storeServer(t, func(o *storage.Options) { o.FlushMode = mode; o.ConsumeQueueEntries = 64 })
			const producers, iterations = 4, 25
			var wg sync.WaitGroup
			errs := make(chan error, producers)
			for p := range producers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range iterations {
						if err := putThenReadGRPC(t, client, fmt.Sprintf("ryw%d-%d", p, i), int32(i%4), i%2 == 1); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

func putThenReadGRPC(t *testing.T, client storagedv1.MessageStoreServiceClient, topic string, qid int32, batch bool) error {
	ctx := ctxT(t)
	var res *storagedv1.AppendResult
	if batch {
		resp, err := client.PutMessages(ctx, &storagedv1.PutMessagesRequest{Topic: topic, QueueId: qid,
			Messages: []*storagedv1.BatchEntry{{Body: []byte("a")}, {Body: []byte("b")}}})
		if err != nil {
			return fmt.Errorf("put batch %s/%d: %w", topic, qid, err)
		}
		res = resp.GetResult()
	} else {
		resp, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: topic, QueueId: qid, Body: []byte("x")}})
		if err != nil {
			return fmt.Errorf("put %s/%d: %w", topic, qid, err)
		}
		res = resp.GetResult()
	}
	info, err := client.GetQueueInfo(ctx, &storagedv1.GetQueueInfoRequest{Topic: topic, QueueId: qid})
	if err != nil || info.GetMaxOffset() <= res.GetQueueOffset() {
		return fmt.Errorf("GetQueueInfo %s/%d right after the put: max offset %d, %v; the put took queue offset %d",
			topic, qid, info.GetMaxOffset(), err, res.GetQueueOffset())
	}
	pulled, err := client.PullMessages(ctx, &storagedv1.PullMessagesRequest{Topic: topic, QueueId: qid, QueueOffset: res.GetQueueOffset()})
	if err != nil || len(pulled.GetMessages()) == 0 || pulled.GetMessages()[0].GetCommitLogOffset() != res.GetWroteOffset() {
		return fmt.Errorf("PullMessages %s/%d right after the put: %d messages, %v", topic, qid, len(pulled.GetMessages()), err)
	}
	return nil
}

// TestEntryDisagreesIsDataLoss: a consume-queue entry whose tags code or
// size is not its record's makes the pull over it DATA_LOSS, with or
// without a tag filter. (Before: a flipped code made the filtered pull
// skip the message, OK and empty.)
func TestEntryDisagreesIsDataLoss(t *testing.T) {
	for _, tc := range []struct {
		name string
		at   int64 // byte of the entry: 8 size, 12 tags code
		tags []string
	}{
		{"tags code, filtered", 12, []string{"want"}},
		{"tags code, unfiltered", 12, nil},
		{"size, filtered", 8, []string{"other"}},
		{"size, unfiltered", 8, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// Damage the entry in its file with the store closed (a
			// running store may hold the queue's tail in memory), then
			// serve the store again.
			dir := t.TempDir()
			st, err := storage.Open(storage.Options{Dir: dir, FileSize: testFileSize, MaxMessageSize: testMaxMessageSize, StoreHost: testStoreHost})
			if err != nil {
				t.Fatal(err)
			}
			for _, tag := range []string{"other", "want", "other"} {
				m := &storage.Message{Topic: "cq", Body: []byte(tag), Properties: []storage.Property{{Key: storage.PropertyTags, Value: tag}}}
				if r, err := st.PutMessage(ctxT(t), m); err != nil || r.Status != storage.PutOK {
					t.Fatal(r.Status, err)
				}
			}
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}
			f, err := os.OpenFile(filepath.Join(dir, "consumequeue", "cq", "0", fmt.Sprintf("%020d", 0)), os.O_RDWR, 0)
			if err != nil {
				t.Fatal(err)
			}
			var entry [20]byte
			if _, err := f.ReadAt(entry[:], 20); err != nil {
				t.Fatal(err)
			}
			if tc.at == 8 { // flip the low bit of the field
				binary.BigEndian.PutUint32(entry[8:], binary.BigEndian.Uint32(entry[8:])^1)
			} else {
				binary.BigEndian.PutUint64(entry[12:], binary.BigEndian.Uint64(entry[12:])^1)
			}
			if _, err := f.WriteAt(entry[:], 20); err != nil {
				t.Fatal(err)
			}
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
			client, _, _ := storeServer(t, func(o *storage.Options) { o.Dir = dir })
			_, err = client.PullMessages(ctxT(t), &storagedv1.PullMessagesRequest{Topic: "cq", Tags: tc.tags})
			details(t, err).want(t, codes.DataLoss, ReasonDataCorrupted, false)
		})
	}
}
