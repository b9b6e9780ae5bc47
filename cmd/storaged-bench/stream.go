package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// streamSlot is one of the Concurrency messages a stream keeps in flight.
// The sender fills it before Send; the receiver empties it when the
// response with its request id arrives. Both sides use atomics: the only
// ordering between them goes through the network.
type streamSlot struct {
	start    atomic.Int64 // UnixNano of the Send; 0 when free
	measured atomic.Bool
}

// slotOf is the slot a request id names: ids are seq<<32 | slot, so that a
// slot reused while an old response is still on the wire is told apart.
func slotOf(id uint64) uint32 { return uint32(id) }

// streamWorker drives one PutMessageStream with Concurrency messages in
// flight until the plan ends, opening a new stream when one fails.
func (g *generator) streamWorker(ctx context.Context, id int) error {
	for {
		done, err := g.runStream(ctx, id)
		if err != nil || done {
			return err
		}
	}
}

// runStream runs one stream. It returns done when the plan is over (or ctx
// cancelled); otherwise the stream failed, its outstanding messages were
// counted as failed with the stream's code, and the caller opens another.
func (g *generator) runStream(ctx context.Context, id int) (done bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := g.client().PutMessageStream(sctx)
	if err != nil {
		if ctx.Err() != nil {
			return true, nil
		}
		return false, fmt.Errorf("open PutMessageStream: %w", err)
	}
	window := g.cfg.Concurrency
	slots := make([]streamSlot, window)
	free := make(chan uint32, window)
	for i := range window {
		free <- uint32(i)
	}
	var planOver atomic.Bool
	sendDone := make(chan struct{})
	go func() {
		defer close(sendDone)
		msg := &storagedv1.Message{Topic: g.cfg.Topic, Body: g.body, Tags: g.cfg.Tags}
		req := &storagedv1.PutMessageStreamRequest{Message: msg}
		var seq uint64
		for {
			var slot uint32
			select {
			case slot = <-free:
			case <-sctx.Done():
				return
			}
			n, measured := g.plan.claim(ctx, 1)
			if n == 0 {
				planOver.Store(true)
				stream.CloseSend()
				return
			}
			seq++
			s := &slots[slot]
			s.measured.Store(measured)
			s.start.Store(time.Now().UnixNano())
			msg.QueueId = g.queue()
			req.RequestId = seq<<32 | uint64(slot)
			if err := stream.Send(req); err != nil {
				return // Recv reports the stream's error
			}
		}
	}()
	defer func() {
		cancel()
		<-sendDone
	}()

	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return planOver.Load(), nil
		}
		if err != nil {
			cancel()
			<-sendDone // no slot is filled after this
			if ctx.Err() != nil {
				return true, nil // cut by the end of the run
			}
			var o outcome
			o.failure(err)
			if o.code == codes.Unimplemented {
				return true, fmt.Errorf("PutMessageStream: %w", err)
			}
			now := time.Now().UnixNano()
			for i := range slots {
				if start := slots[i].start.Swap(0); start != 0 {
					f := o
					f.msgs, f.bytes, f.latency = 1, len(g.body), time.Duration(now-start)
					g.rec.record(id, slots[i].measured.Load(), &f)
				}
			}
			return planOver.Load(), nil
		}
		slot := slotOf(resp.GetRequestId())
		if int(slot) >= window {
			return true, fmt.Errorf("PutMessageStream: response for unknown request id %d", resp.GetRequestId())
		}
		s := &slots[slot]
		start := s.start.Swap(0)
		if start == 0 {
			return true, fmt.Errorf("PutMessageStream: second response for request id %d", resp.GetRequestId())
		}
		o := outcome{msgs: 1, bytes: len(g.body), latency: time.Duration(time.Now().UnixNano() - start), status: resp.GetStatus()}
		if c := codes.Code(resp.GetCode()); c != codes.OK {
			o.failed, o.code, o.reason = true, c, resp.GetReason()
		}
		g.rec.record(id, s.measured.Load(), &o)
		free <- slot
	}
}
