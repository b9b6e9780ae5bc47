package peer

import (
	"bytes"
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
	"github.com/storaged/storaged/internal/logthrottle"
	"github.com/storaged/storaged/storage/commitlog"
	"github.com/storaged/storaged/storage/record"
	"github.com/storaged/storaged/storage/segment"
	"github.com/storaged/storaged/storage/snapshot"
	"github.com/storaged/storaged/storage/vfs"
)

const snapFileSize = 64 << 10

// snapSource is a commitlog on real files with n records of ~5 KiB
// (about 12 a file) and the manifest of all of it.
func snapSource(t testing.TB, n int) (*commitlog.Log, snapshot.Manifest, string) {
	t.Helper()
	return snapSourceSize(t, n, snapFileSize)
}

func snapSourceSize(t testing.TB, n int, snapFileSize int64) (*commitlog.Log, snapshot.Manifest, string) {
	t.Helper()
	nop := zerolog.Nop()
	dir := filepath.Join(t.TempDir(), "commitlog")
	if err := vfs.Default.MkdirAll(dir); err != nil {
		t.Fatal(err)
	}
	l, err := commitlog.Open(commitlog.Options{FS: vfs.Default, Dir: dir, FileSize: snapFileSize, RequireCRC: true,
		Clock: systemClock{}, Logger: &nop, Throttle: logthrottle.New(time.Second, nil)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if _, err := l.Recover(0, 0); err != nil {
		t.Fatal(err)
	}
	l.Start()
	host := netip.MustParseAddrPort("127.0.0.1:10911")
	for i := range n {
		sp := record.Spec{Topic: "T", Body: bytes.Repeat([]byte{byte(i)}, 5000+i), StoreHost: host, PropCRC: true}
		sp.BodyCRC = record.BodyCRC(sp.Body)
		if ferr := sp.Size(); ferr != nil {
			t.Fatal(ferr)
		}
		if _, err := l.Append(sp.Total, nil, func(dst []byte, at int64) { sp.Encode(dst, int64(i), at, int64(1000+i)) }); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := l.Sync(0); err != nil {
		t.Fatal(err)
	}
	files, err := snapshot.Files(l, snapFileSize, l.MinOffset(), l.MaxOffset())
	if err != nil {
		t.Fatal(err)
	}
	m := snapshot.Manifest{Version: snapshot.Version, Index: 7, Term: 2, FileSize: snapFileSize, MinOffset: l.MinOffset(),
		End: l.MaxOffset(), LastStoreTS: int64(1000 + n - 1), Files: files}
	return l, m, dir
}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// outgoing is an OutgoingSnapshot over a real commitlog; mutate may
// change each chunk (or fail the read) before it is sent.
type outgoing struct {
	src    *commitlog.Log
	m      snapshot.Manifest
	mutate func(i int, c *snapshot.Chunk) error
	done   chan error
}

func newOutgoing(src *commitlog.Log, m snapshot.Manifest) *outgoing {
	return &outgoing{src: src, m: m, done: make(chan error, 1)}
}

func (o *outgoing) Message() ([]byte, error) { return o.m.Encode() }

func (o *outgoing) Read(chunkBytes int, send func(file, offset int64, data []byte, crc uint32) error) error {
	i := 0
	return snapshot.Read(o.src, &o.m, chunkBytes, func(c snapshot.Chunk) error {
		if o.mutate != nil {
			if err := o.mutate(i, &c); err != nil {
				return err
			}
		}
		i++
		return send(c.File, c.Offset, c.Data, c.CRC)
	})
}

func (o *outgoing) Done(err error) { o.done <- err }

func (o *outgoing) wait(t testing.TB) error {
	t.Helper()
	select {
	case err := <-o.done:
		return err
	case <-time.After(60 * time.Second):
		t.Fatal("the snapshot send never finished")
		return nil
	}
}

// stager is a Stepper that takes snapshots into a real snapshot.Stage in
// dir; the message is the manifest itself.
type stager struct {
	recorder
	dir          string
	notInstalled atomic.Bool   // Finish verifies, then answers snapshot.ErrNotInstalled
	fileSize     int64         // 0: snapFileSize
	seen         chan struct{} // closed at the first chunk

	mu                                    sync.Mutex
	finished, discarded, received, chunks int
	last                                  snapshot.Manifest
}

type incoming struct {
	s  *stager
	st *snapshot.Stage
}

func (s *stager) ReceiveSnapshot(from uint64, msg []byte) (IncomingSnapshot, error) {
	m, err := snapshot.Decode(msg)
	if err != nil {
		return nil, err
	}
	fileSize := s.fileSize
	if fileSize == 0 {
		fileSize = snapFileSize
	}
	st, err := snapshot.NewStage(snapshot.StageOptions{FS: vfs.Default, Dir: filepath.Join(s.dir, "snapshot.tmp"),
		FileSize: fileSize, MaxBytes: 1 << 30, RequireCRC: true}, m)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.received++
	s.mu.Unlock()
	return &incoming{s: s, st: st}, nil
}

func (in *incoming) Write(file, offset int64, data []byte, crc uint32) error {
	in.s.mu.Lock()
	if in.s.chunks++; in.s.chunks == 1 {
		close(in.s.seen)
	}
	in.s.mu.Unlock()
	return in.st.Write(snapshot.Chunk{File: file, Offset: offset, Data: data, CRC: crc})
}

func (in *incoming) Finish() error {
	if err := in.st.Finish(); err != nil {
		return err
	}
	if in.s.notInstalled.Load() {
		return snapshot.ErrNotInstalled
	}
	in.s.mu.Lock()
	defer in.s.mu.Unlock()
	in.s.finished++
	in.s.last = in.st.Manifest()
	return nil
}

func (in *incoming) Discard() {
	in.st.Discard()
	in.s.mu.Lock()
	defer in.s.mu.Unlock()
	in.s.discarded++
}

func (s *stager) counts() (received, finished, discarded int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.received, s.finished, s.discarded
}

// snapPair starts two transports on loopback, member 2 a stager.
func snapPair(t testing.TB, mod func(*Options)) (*Transport, *Transport, *stager) {
	t.Helper()
	lis, peers := listeners(t, 2)
	recv := &stager{dir: t.TempDir(), seen: make(chan struct{})}
	o1, o2 := testOptions(1, peers), testOptions(2, peers)
	if mod != nil {
		mod(&o1)
	}
	t1, err := New(lis[0], &recorder{}, o1)
	if err != nil {
		t.Fatal(err)
	}
	t2, err := New(lis[1], recv, o2)
	if err != nil {
		t1.Close()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := t1.Close(); err != nil {
			t.Error(err)
		}
		if err := t2.Close(); err != nil {
			t.Error(err)
		}
	})
	return t1, t2, recv
}

// TestSnapshotTransfer: a snapshot of a commitlog of several files goes
// from member 1 to member 2 over InstallSnapshot; member 2 stages and
// verifies it, and the staged files hold exactly the sender's bytes.
func TestSnapshotTransfer(t *testing.T) {
	src, m, srcDir := snapSource(t, 60)
	if len(m.Files) < 4 {
		t.Fatalf("%d files, want at least 4", len(m.Files))
	}
	t1, t2, recv := snapPair(t, nil)
	out := newOutgoing(src, m)
	start := time.Now()
	t1.SendSnapshot(2, out)
	if err := out.wait(t); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	if r, f, d := recv.counts(); r != 1 || f != 1 || d != 0 {
		t.Fatalf("received %d, finished %d, discarded %d; want 1, 1, 0", r, f, d)
	}
	for _, f := range m.Files {
		got, err := vfs.Default.ReadFile(filepath.Join(recv.dir, "snapshot.tmp", segment.FileName(f.From)))
		if err != nil {
			t.Fatal(err)
		}
		want, err := vfs.Default.ReadFile(filepath.Join(srcDir, segment.FileName(f.From)))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got[:f.Size], want[:f.Size]) || !commitlog.AllZero(got[f.Size:]) {
			t.Fatalf("staged file %d differs from the sender's", f.From)
		}
	}
	st := t1.PeerSnapshotStats(2)
	if st.Sent != 1 || st.SentBytes != uint64(m.Bytes()) || t2.SnapshotsReceived() != 1 {
		t.Fatalf("stats %+v, received %d; want 1 snapshot of %d bytes", st, t2.SnapshotsReceived(), m.Bytes())
	}
	t.Logf("snapshot of %d files, %d bytes, in %v", len(m.Files), m.Bytes(), took)
}

// TestSnapshotRefused: a chunk with a wrong CRC, a flipped byte under a
// recomputed CRC, and a sender that stops halfway (its stream ends
// without EOF) each end with the receiver discarding the staging dir, an
// error for the sender, and no snapshot taken.
func TestSnapshotRefused(t *testing.T) {
	errStop := errors.New("the sender's source went away")
	cases := []struct {
		name   string
		mutate func(i int, c *snapshot.Chunk) error
		code   codes.Code
		want   error
	}{
		{"chunk CRC", func(i int, c *snapshot.Chunk) error {
			if i == 2 {
				c.CRC ^= 1
			}
			return nil
		}, codes.InvalidArgument, nil},
		{"flipped byte", func(i int, c *snapshot.Chunk) error {
			if i == 1 {
				c.Data = append([]byte(nil), c.Data...)
				c.Data[100] ^= 1
				c.CRC = snapshot.CRC(c.Data)
			}
			return nil
		}, codes.InvalidArgument, nil},
		{"sender stops halfway", nil, codes.OK, errStop},
		{"verified, not installed", nil, codes.Unimplemented, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src, m, _ := snapSource(t, 60)
			t1, t2, recv := snapPair(t, nil)
			recv.notInstalled.Store(tc.code == codes.Unimplemented)
			out := newOutgoing(src, m)
			out.mutate = tc.mutate
			if tc.want == errStop {
				// Stop once the receiver has staged a chunk, so that it
				// has a stage to discard (a stream cancelled earlier may
				// never reach its handler).
				out.mutate = func(i int, c *snapshot.Chunk) error {
					if i < 2 {
						return nil
					}
					select {
					case <-recv.seen:
					case <-time.After(30 * time.Second):
					}
					return errStop
				}
			}
			t1.SendSnapshot(2, out)
			err := out.wait(t)
			switch {
			case tc.want != nil && !errors.Is(err, tc.want):
				t.Fatalf("send: %v, want %v", err, tc.want)
			case tc.want == nil && status.Code(err) != tc.code:
				t.Fatalf("send: %v, want code %v", err, tc.code)
			}
			// The receiver learns of a cut stream asynchronously.
			waitFor(t, "the receiver's discard", 30*time.Second, func() bool { _, _, d := recv.counts(); return d == 1 })
			if r, f, _ := recv.counts(); r != 1 || f != 0 || t2.SnapshotsReceived() != 0 {
				t.Fatalf("received %d, finished %d, taken %d; want 1, 0, 0", r, f, t2.SnapshotsReceived())
			}
			if _, err := vfs.Default.ReadDir(filepath.Join(recv.dir, "snapshot.tmp")); err == nil {
				t.Fatal("the staging dir survived the refusal")
			}
		})
	}
}

// TestSnapshotOneInFlight: while a snapshot to a peer is in flight, a
// second one to it is refused at once with ErrSnapshotInFlight; the first
// completes.
func TestSnapshotOneInFlight(t *testing.T) {
	src, m, _ := snapSource(t, 60)
	t1, _, recv := snapPair(t, nil)
	first := newOutgoing(src, m)
	inRead, release := make(chan struct{}), make(chan struct{})
	first.mutate = func(i int, c *snapshot.Chunk) error {
		if i == 1 {
			close(inRead)
			<-release
		}
		return nil
	}
	t1.SendSnapshot(2, first)
	<-inRead
	second := newOutgoing(src, m)
	t1.SendSnapshot(2, second)
	if err := second.wait(t); !errors.Is(err, ErrSnapshotInFlight) {
		t.Fatalf("second: %v, want ErrSnapshotInFlight", err)
	}
	close(release)
	if err := first.wait(t); err != nil {
		t.Fatal(err)
	}
	unknown := newOutgoing(src, m)
	t1.SendSnapshot(9, unknown)
	if err := unknown.wait(t); !errors.Is(err, ErrUnknownPeer) {
		t.Fatalf("to member 9: %v, want ErrUnknownPeer", err)
	}
	if r, f, _ := recv.counts(); r != 1 || f != 1 {
		t.Fatalf("received %d, finished %d; want 1, 1", r, f)
	}
}

// TestSnapshotHeaderChecks: a first chunk for another group, cluster or
// member, from a stranger, or without the MsgSnap is refused before the
// receiver sees it; so is a header repeated in a later chunk.
func TestSnapshotHeaderChecks(t *testing.T) {
	src, m, _ := snapSource(t, 3)
	_, t2, recv := snapPair(t, nil)
	conn, err := grpc.NewClient("passthrough:///"+t2.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	msg, err := newOutgoing(src, m).Message()
	if err != nil {
		t.Fatal(err)
	}
	good := func() *peerv1.SnapshotChunk {
		return &peerv1.SnapshotChunk{Group: "g1", ClusterId: "c1", From: 1, To: 2, Message: msg}
	}
	cases := []struct {
		name  string
		head  func(c *peerv1.SnapshotChunk)
		later *peerv1.SnapshotChunk
		code  codes.Code
	}{
		{"group", func(c *peerv1.SnapshotChunk) { c.Group = "g2" }, nil, codes.PermissionDenied},
		{"cluster", func(c *peerv1.SnapshotChunk) { c.ClusterId = "c2" }, nil, codes.PermissionDenied},
		{"member", func(c *peerv1.SnapshotChunk) { c.To = 3 }, nil, codes.PermissionDenied},
		{"stranger", func(c *peerv1.SnapshotChunk) { c.From = 7 }, nil, codes.PermissionDenied},
		{"no message", func(c *peerv1.SnapshotChunk) { c.Message = nil }, nil, codes.InvalidArgument},
		{"bad manifest", func(c *peerv1.SnapshotChunk) { c.Message = []byte("{}\n0\n") }, nil, codes.InvalidArgument},
		{"header again", nil, &peerv1.SnapshotChunk{Group: "g1", File: 0, Data: []byte("x")}, codes.InvalidArgument},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			st, err := peerv1.NewRaftClient(conn).InstallSnapshot(ctx)
			if err != nil {
				t.Fatal(err)
			}
			h := good()
			if tc.head != nil {
				tc.head(h)
			}
			_ = st.Send(h)
			if tc.later != nil {
				_ = st.Send(tc.later)
			}
			_, err = st.CloseAndRecv()
			if status.Code(err) != tc.code {
				t.Fatalf("got %v, want %v", err, tc.code)
			}
		})
	}
	if _, f, _ := recv.counts(); f != 0 {
		t.Fatalf("%d snapshots finished", f)
	}
}

// BenchmarkSnapshotTransfer: one snapshot of a commitlog of about 40 MiB
// (8 MiB files) sent over loopback gRPC, staged, CRC-checked, scanned and
// synced on the receiver per iteration, without the rate limit.
func BenchmarkSnapshotTransfer(b *testing.B) {
	src, m, _ := snapSourceSize(b, 8000, 8<<20)
	t1, _, recv := snapPair(b, func(o *Options) { o.SnapshotRate = 1 << 40 })
	recv.fileSize = 8 << 20
	b.SetBytes(m.Bytes())
	b.ResetTimer()
	for range b.N {
		out := newOutgoing(src, m)
		t1.SendSnapshot(2, out)
		if err := out.wait(b); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if _, f, _ := recv.counts(); f != b.N {
		b.Fatalf("%d snapshots taken of %d", f, b.N)
	}
}
