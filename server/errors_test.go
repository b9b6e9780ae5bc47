package server

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	"github.com/storaged/storaged/client"
	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// TestPutErrorMapping covers every branch of putError, including the store
// outcomes a healthy test store cannot produce (disk full, busy, failed
// sync, appended with unknown durability). The inputs are exactly what
// storage.Store returns in those cases (store.go rejectErr / afterAppend).
func TestPutErrorMapping(t *testing.T) {
	const secretPath = "/var/lib/secret/commitlog/00000000000000000000"
	appended := storage.AppendResult{
		Status: storage.AppendOK, WroteOffset: 4096, WroteBytes: 120, QueueID: 3, QueueOffset: 17, MsgNum: 1,
		StoreHost: netip.MustParseAddrPort("10.0.0.1:10911"),
	}
	rejected := func(st storage.PutStatus) storage.PutResult { return storage.PutResult{Status: st} }
	stored := func() storage.PutResult { return storage.PutResult{Status: storage.UnknownError, Append: appended} }

	cases := []struct {
		name      string
		res       storage.PutResult
		err       error
		code      codes.Code
		reason    string
		retry     bool
		msg       string // substring of the message
		appended  bool   // ErrorInfo metadata carries msg_id etc.
		badField  string // BadRequest field, "" for none
		metaCause string
	}{
		{name: "validation", res: rejected(storage.MessageIllegal),
			err:  &storage.ValidationError{Status: storage.MessageIllegal, Field: "body", Reason: "too big"},
			code: codes.InvalidArgument, reason: "MESSAGE_ILLEGAL", msg: "too big", badField: "message.body"},
		{name: "properties size", res: rejected(storage.PropertiesSizeExceeded),
			err:  &storage.ValidationError{Status: storage.PropertiesSizeExceeded, Field: "properties", Reason: "long"},
			code: codes.InvalidArgument, reason: "PROPERTIES_SIZE_EXCEEDED", msg: "long", badField: "message.properties"},
		{name: "busy", res: rejected(storage.OSPageCacheBusy), err: storage.ErrBusy,
			code: codes.Unavailable, reason: "OS_PAGE_CACHE_BUSY", retry: true, msg: "nothing was stored"},
		{name: "closed", res: rejected(storage.ServiceNotAvailable), err: storage.ErrClosed,
			code: codes.Unavailable, reason: "SERVICE_NOT_AVAILABLE", retry: true, msg: "shutting down"},
		{name: "slave", res: rejected(storage.ServiceNotAvailable), err: storage.ErrSlave,
			code: codes.Unavailable, reason: "SERVICE_NOT_AVAILABLE", retry: true, msg: "slave"},
		{name: "not writable", res: rejected(storage.ServiceNotAvailable), err: fmt.Errorf("disk above watermark: %w", storage.ErrNotWritable),
			code: codes.Unavailable, reason: "SERVICE_NOT_AVAILABLE", retry: true, msg: "nothing was stored"},
		{name: "starting", res: rejected(storage.ServiceNotAvailable), err: ErrStarting,
			code: codes.Unavailable, reason: "SERVICE_NOT_AVAILABLE", retry: true, msg: "starting"},
		{name: "read-only after failed sync", res: rejected(storage.ServiceNotAvailable),
			err:  fmt.Errorf("%w: msync %s: input/output error", storage.ErrWriteFailed, secretPath),
			code: codes.Unavailable, reason: "SERVICE_NOT_AVAILABLE", retry: false, msg: "another replica", metaCause: "READ_ONLY"},
		{name: "disk full", res: rejected(storage.CreateMappedFileFailed),
			err:  fmt.Errorf("%w: %w: fallocate %s", storage.ErrCreateFile, storage.ErrDiskFull, secretPath),
			code: codes.ResourceExhausted, reason: "CREATE_MAPPED_FILE_FAILED", msg: "no space", metaCause: "DISK_FULL"},
		{name: "disk above warning watermark", res: rejected(storage.ServiceNotAvailable),
			err: fmt.Errorf("%w: %w: the data dir's file system is 95.0%% full, above the warning watermark of 90%%; writes resume at 85%%",
				storage.ErrNotWritable, storage.ErrDiskFull),
			code: codes.ResourceExhausted, reason: "SERVICE_NOT_AVAILABLE", retry: true, msg: "warning watermark", metaCause: "DISK_FULL"},
		{name: "create mapped file failed", res: rejected(storage.CreateMappedFileFailed),
			err:  fmt.Errorf("%w: mmap %s: cannot allocate memory", storage.ErrCreateFile, secretPath),
			code: codes.Unavailable, reason: "CREATE_MAPPED_FILE_FAILED", retry: true, msg: "nothing was stored"},
		{name: "corrupt", res: rejected(storage.UnknownError), err: fmt.Errorf("%w: bad CRC in %s", storage.ErrCorrupt, secretPath),
			code: codes.DataLoss, reason: "UNKNOWN_ERROR", msg: "nothing was stored"},
		{name: "unknown error", res: rejected(storage.UnknownError), err: fmt.Errorf("open %s: %w", secretPath, errTest),
			code: codes.Internal, reason: "UNKNOWN_ERROR", msg: "nothing was stored"},
		{name: "no status", res: storage.PutResult{}, err: errTest,
			code: codes.Internal, reason: "UNKNOWN_ERROR", msg: "internal error"},
		{name: "cancelled before append", res: rejected(storage.UnknownError), err: context.Canceled,
			code: codes.Canceled, reason: "UNKNOWN_ERROR", msg: "nothing was stored"},
		{name: "deadline before append", res: rejected(storage.UnknownError), err: context.DeadlineExceeded,
			code: codes.DeadlineExceeded, reason: "UNKNOWN_ERROR", msg: "nothing was stored"},
		{name: "appended, cancelled during flush wait", res: stored(), err: context.Canceled,
			code: codes.Canceled, reason: "UNKNOWN_ERROR", msg: "may have been stored", appended: true},
		{name: "appended, deadline during flush wait", res: stored(), err: context.DeadlineExceeded,
			code: codes.DeadlineExceeded, reason: "UNKNOWN_ERROR", msg: "may have been stored", appended: true},
		{name: "appended, sync failed", res: stored(),
			err:  fmt.Errorf("%w: flush: sync failed: msync %s", storage.ErrWriteFailed, secretPath),
			code: codes.Internal, reason: "UNKNOWN_ERROR", msg: "may have been stored", appended: true},
		{name: "appended, closed during flush wait", res: stored(),
			err:  fmt.Errorf("%w: store closed before the sync covered the message", storage.ErrClosed),
			code: codes.Internal, reason: "UNKNOWN_ERROR", msg: "may have been stored", appended: true},
	}
	svc := New(&fakeStore{}, zerologNop())
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := svc.putError(t.Context(), methodPutMessage, tc.res, tc.err)
			d := details(t, err)
			d.want(t, tc.code, tc.reason, tc.retry)
			if !strings.Contains(d.st.Message(), tc.msg) {
				t.Errorf("message %q does not contain %q", d.st.Message(), tc.msg)
			}
			// The client helper retries exactly the refusals that stored
			// nothing: UNAVAILABLE, never an appended put.
			if ns := client.Classify(err).NothingStored; ns != (tc.code == codes.Unavailable && !tc.appended) ||
				(ns && !strings.Contains(d.st.Message(), "nothing was stored")) {
				t.Errorf("client.Classify: NothingStored %v for %v %q", ns, tc.code, d.st.Message())
			}
			if strings.Contains(d.st.Message(), "/var/lib") {
				t.Errorf("message leaks a path: %q", d.st.Message())
			}
			if (d.badRequest != nil) != (tc.badField != "") {
				t.Errorf("BadRequest %v, want field %q", d.badRequest, tc.badField)
			} else if tc.badField != "" && d.badRequest.GetFieldViolations()[0].GetField() != tc.badField {
				t.Errorf("BadRequest field %q, want %q", d.badRequest.GetFieldViolations()[0].GetField(), tc.badField)
			}
			md := d.info.GetMetadata()
			if got := md["cause"]; got != tc.metaCause {
				t.Errorf("metadata cause %q, want %q", got, tc.metaCause)
			}
			if tc.appended {
				want := map[string]string{"stored": "unknown", "msg_id": appended.MsgID(), "wrote_offset": "4096",
					"wrote_bytes": "120", "queue_id": "3", "queue_offset": "17", "message_count": "1"}
				for k, v := range want {
					if md[k] != v {
						t.Errorf("metadata %s = %q, want %q", k, md[k], v)
					}
				}
				if !strings.Contains(d.st.Message(), appended.MsgID()) || strings.Contains(d.st.Message(), "nothing was stored") {
					t.Errorf("message %q must name the msgId and not claim nothing was stored", d.st.Message())
				}
			} else if md["msg_id"] != "" {
				t.Errorf("rejected put carries msg_id %q", md["msg_id"])
			}
		})
	}
}

func TestRequestField(t *testing.T) {
	for _, tc := range []struct {
		m           method
		field, want string
	}{
		{methodPutMessage, "topic", "message.topic"},
		{methodPutMessage, "body", "message.body"},
		{methodPutMessage, "", "message"},
		{methodPutMessages, "topic", "topic"},
		{methodPutMessages, "queue_id", "queue_id"},
		{methodPutMessages, "messages", "messages"},
		{methodPutMessages, "properties", "messages"},
		{methodPutMessages, "batch", "messages"},
	} {
		if got := requestField(tc.m, tc.field); got != tc.want {
			t.Errorf("requestField(%s, %q) = %q, want %q", tc.m, tc.field, got, tc.want)
		}
	}
}

// TestDegradedStatusIsOK: a put the store took with degraded durability is
// an OK response carrying that status (never an error).
func TestDegradedStatusIsOK(t *testing.T) {
	for _, st := range []storage.PutStatus{storage.FlushDiskTimeout, storage.FlushSlaveTimeout, storage.SlaveNotAvailable} {
		res := storage.PutResult{Status: st, Append: storage.AppendResult{
			Status: storage.AppendOK, WroteOffset: 64, WroteBytes: 100, MsgNum: 2, Offsets: []int64{64, 114},
			StoreHost: testStoreHost,
		}}
		svc := New(&fakeStore{res: res}, zerologNop())
		resp, err := svc.PutMessage(t.Context(), &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "t", Body: []byte("b")}})
		if err != nil {
			t.Fatalf("%v: %v", st, err)
		}
		if resp.GetStatus() != toProtoStatus(st) || resp.GetResult().GetWroteOffset() != 64 {
			t.Errorf("%v: response %v", st, resp)
		}
		bresp, err := svc.PutMessages(t.Context(), &storagedv1.PutMessagesRequest{Topic: "t", Messages: []*storagedv1.BatchEntry{{Body: []byte("b")}, {Body: []byte("c")}}})
		if err != nil {
			t.Fatalf("%v batch: %v", st, err)
		}
		if bresp.GetStatus() != toProtoStatus(st) || len(bresp.GetResult().GetMsgIds()) != 2 {
			t.Errorf("%v batch: response %v", st, bresp)
		}
	}
}
