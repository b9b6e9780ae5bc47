package peer

import (
	"context"
	"errors"
	"fmt"
	"io"

	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	peerv1 "github.com/storaged/storaged/gen/storaged/peer/v1"
	"github.com/storaged/storaged/storage/snapshot"
)

// Snapshots travel out of band of the raft messages (design §3.5): raft's
// MsgSnap never goes through Send's queue, because its data (the
// commitlog files) is far larger than a message. The store hands an
// OutgoingSnapshot to SendSnapshot; a goroutine of the Transport streams
// it over InstallSnapshot, rate-limited, at most one at a time per peer,
// and tells the store the outcome (which it reports to raft: the sender's
// ReportSnapshot). On the other side the stream is fed into the Stepper's
// IncomingSnapshot, which stages and verifies the files before raft sees
// the MsgSnap.

// DefaultSnapshotRate is the default bound on snapshot bytes sent per
// second, over all peers: a snapshot competes with the put path for the
// disk and the network.
const DefaultSnapshotRate = 64 << 20

// snapshotChunkBytes is the size of the chunks SendSnapshot asks for.
const snapshotChunkBytes = 1 << 20

// ErrSnapshotInFlight: a snapshot to that peer is already being sent.
var ErrSnapshotInFlight = errors.New("peer: a snapshot to this peer is already in flight")

// ErrUnknownPeer: SendSnapshot to a member this transport does not know.
var ErrUnknownPeer = errors.New("peer: unknown peer")

// OutgoingSnapshot is a snapshot the store sends to one peer: Message
// (the MsgSnap, its data the manifest), Read (the file chunks), Done (the
// outcome, which the store reports to raft and which unpins the files).
type OutgoingSnapshot = snapshot.Outgoing

// SnapshotReceiver is implemented by a Stepper that takes snapshots.
type SnapshotReceiver interface {
	// ReceiveSnapshot starts receiving a snapshot from member from; msg is
	// the marshalled MsgSnap (its data the manifest). An error refuses it.
	ReceiveSnapshot(from uint64, msg []byte) (IncomingSnapshot, error)
}

// IncomingSnapshot is one snapshot being received: Write per chunk (an
// error refuses the snapshot), Finish after the last one (verify, sync,
// hand the MsgSnap to raft; an error refuses it), or Discard (at most
// once, never after a Finish that succeeded) when it was refused or cut
// off: nothing stored before it may change.
type IncomingSnapshot = snapshot.Incoming

// SendSnapshot sends s to peer to on a goroutine of the Transport and
// calls s.Done with the outcome. It never blocks. A second snapshot to a
// peer while one is in flight is refused (Done(ErrSnapshotInFlight));
// raft asks again later.
//
// The snapshot is sent to the peer's address of the moment and ends
// (Done with an error) if the peer is removed or moved meanwhile.
func (t *Transport) SendSnapshot(to uint64, s OutgoingSnapshot) {
	l := t.peerLink(to)
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		switch {
		case l == nil:
			s.Done(fmt.Errorf("%w: %d", ErrUnknownPeer, to))
		case !l.snapshotting.CompareAndSwap(false, true):
			s.Done(ErrSnapshotInFlight)
		default:
			err := l.sendSnapshot(l.ctx, s)
			l.snapshotting.Store(false)
			if err != nil {
				l.log.Warn().Err(err).Msg("snapshot not sent")
			}
			s.Done(err)
		}
	}()
}

// sendSnapshot streams one snapshot and waits for the receiver's result.
func (l *link) sendSnapshot(ctx context.Context, s OutgoingSnapshot) error {
	t := l.t
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := peerv1.NewRaftClient(l.conn).InstallSnapshot(ctx)
	if err != nil {
		return err
	}
	o := &t.opts
	msg, err := s.Message()
	if err != nil {
		return err
	}
	head := &peerv1.SnapshotChunk{Group: o.Group, ClusterId: o.ClusterID, From: o.ID, To: l.id, Message: msg}
	if err := st.Send(head); err != nil {
		return closeErr(st, err)
	}
	var c peerv1.SnapshotChunk
	err = s.Read(snapshotChunkBytes, func(file, offset int64, data []byte, crc uint32) error {
		if err := t.snapRate.WaitN(ctx, len(data)); err != nil {
			return err
		}
		c.File, c.Offset, c.Data, c.Crc32C = file, offset, data, crc
		if err := st.Send(&c); err != nil {
			return closeErr(st, err)
		}
		l.snapshotBytes.Add(uint64(len(data)))
		return nil
	})
	if err != nil {
		return err
	}
	if _, err := st.CloseAndRecv(); err != nil {
		return err
	}
	l.snapshotsSent.Add(1)
	return nil
}

// closeErr turns io.EOF from Send (the server ended the stream) into the
// server's status.
func closeErr(st grpc.ClientStreamingClient[peerv1.SnapshotChunk, peerv1.SnapshotResult], err error) error {
	if errors.Is(err, io.EOF) {
		_, err = st.CloseAndRecv()
	}
	return err
}

// InstallSnapshot receives one snapshot: the header and MsgSnap in chunk
// 0, then file chunks into the Stepper's IncomingSnapshot. One at a time.
func (h *handler) InstallSnapshot(st grpc.ClientStreamingServer[peerv1.SnapshotChunk, peerv1.SnapshotResult]) error {
	t := h.t
	if !t.receiving.CompareAndSwap(false, true) {
		return status.Error(codes.ResourceExhausted, "peer: a snapshot is already being received")
	}
	defer t.receiving.Store(false)
	head, err := st.Recv()
	if err != nil {
		return err
	}
	if err := h.checkSnapshotHead(head); err != nil {
		t.log.Warn().Err(err).Uint64("from", head.GetFrom()).Msg("snapshot refused")
		return err
	}
	if err := h.checkCert(st, head.GetFrom()); err != nil {
		return err
	}
	r, ok := t.getStepper().(SnapshotReceiver)
	if !ok {
		return status.Error(codes.Unavailable, "peer: this member does not take snapshots now")
	}
	in, err := r.ReceiveSnapshot(head.GetFrom(), head.GetMessage())
	if err != nil {
		return status.Errorf(codes.InvalidArgument, "peer: snapshot refused: %v", err)
	}
	var res peerv1.SnapshotResult
	finished := false
	defer func() {
		if !finished {
			in.Discard()
		}
	}()
	for {
		c, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.log.Warn().Err(err).Uint64("from", head.GetFrom()).Uint64("bytes", res.Bytes).Msg("snapshot stream broke; discarded")
			return err
		}
		if err := h.stillPeer(head.GetFrom()); err != nil {
			return err
		}
		if c.GetGroup() != "" || c.GetClusterId() != "" || c.GetFrom() != 0 || c.GetTo() != 0 || len(c.GetMessage()) != 0 {
			return status.Error(codes.InvalidArgument, "peer: a header in a snapshot chunk after the first")
		}
		if err := in.Write(c.GetFile(), c.GetOffset(), c.GetData(), c.GetCrc32C()); err != nil {
			t.log.Warn().Err(err).Uint64("from", head.GetFrom()).Msg("snapshot chunk refused; discarded")
			return status.Errorf(codes.InvalidArgument, "peer: snapshot chunk refused: %v", err)
		}
		res.Bytes += uint64(len(c.GetData()))
		res.Chunks++
	}
	// Membership is checked on every chunk and once more here, not only
	// with the header: a member removed while its snapshot streamed must
	// not install it.
	if err := h.stillPeer(head.GetFrom()); err != nil {
		return err
	}
	if err := in.Finish(); err != nil {
		if errors.Is(err, snapshot.ErrNotInstalled) {
			return status.Errorf(codes.Unimplemented, "peer: %v", err)
		}
		t.log.Warn().Err(err).Uint64("from", head.GetFrom()).Msg("snapshot did not verify; discarded")
		return status.Errorf(codes.DataLoss, "peer: snapshot refused: %v", err)
	}
	finished = true
	t.snapshotsReceived.Add(1)
	return st.SendAndClose(&res)
}

func (h *handler) checkSnapshotHead(c *peerv1.SnapshotChunk) error {
	o := &h.t.opts
	switch {
	case c.GetGroup() != o.Group:
		return status.Errorf(codes.PermissionDenied, "peer: snapshot for group %q, this member is in %q", trunc(c.GetGroup()), o.Group)
	case c.GetClusterId() != o.ClusterID:
		return status.Errorf(codes.PermissionDenied, "peer: snapshot for cluster %q, this member is in %q", trunc(c.GetClusterId()), o.ClusterID)
	case c.GetTo() != o.ID:
		return status.Errorf(codes.PermissionDenied, "peer: snapshot for member %d, this is member %d", c.GetTo(), o.ID)
	case h.t.knownLink(c.GetFrom()) == nil:
		// A stranger (one whose Send stream is open) may send one: a
		// leader this member has not heard of, which no longer holds
		// the entries this member misses.
		return status.Errorf(codes.PermissionDenied, "peer: snapshot from member %d, not a peer of member %d", c.GetFrom(), o.ID)
	case len(c.GetMessage()) == 0 || len(c.GetData()) != 0:
		return status.Error(codes.InvalidArgument, "peer: a snapshot's first chunk holds the MsgSnap and no file bytes")
	}
	return nil
}

// stillPeer refuses the rest of a snapshot stream from a member that
// RemovePeer forgot after the stream's header was checked (or a stranger
// whose Send stream ended).
func (h *handler) stillPeer(from uint64) error {
	if h.t.knownLink(from) == nil {
		h.t.log.Warn().Uint64("from", from).Msg("snapshot from a removed member; discarded")
		return status.Errorf(codes.PermissionDenied, "peer: snapshot from member %d, no longer a peer of member %d", from, h.t.opts.ID)
	}
	return nil
}

// SnapshotStats counts one peer's snapshot traffic (outgoing) and, for
// the Transport, the snapshots received.
type SnapshotStats struct {
	Sent      uint64 // snapshots the peer took
	SentBytes uint64 // file bytes sent to the peer (taken or not)
}

// PeerSnapshotStats returns the snapshot counters for peer id.
func (t *Transport) PeerSnapshotStats(id uint64) SnapshotStats {
	l := t.peerLink(id)
	if l == nil {
		return SnapshotStats{}
	}
	return SnapshotStats{Sent: l.snapshotsSent.Load(), SentBytes: l.snapshotBytes.Load()}
}

// SnapshotsReceived counts the snapshots this member took.
func (t *Transport) SnapshotsReceived() uint64 { return t.snapshotsReceived.Load() }

func newSnapshotLimiter(bytesPerSec int) *rate.Limiter {
	// The burst must hold the largest chunk WaitN is asked for.
	return rate.NewLimiter(rate.Limit(bytesPerSec), max(bytesPerSec, snapshotChunkBytes))
}
