package storage

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCorruptCheckpointRebuild: each way a checkpoint can be corrupt makes
// Open fail with a *CheckpointError naming the file, Check report it (and
// still check the commitlog), and RebuildCheckpoint set it aside and write
// one from which Open serves every message, batches whole, and goes on at
// the next queue offsets.
func TestCorruptCheckpointRebuild(t *testing.T) {
	withCRC := func(body string) []byte {
		return fmt.Appendf(nil, "%s\n%d\n", body, crc32.Checksum([]byte(body), castagnoli))
	}
	tests := []struct {
		name    string
		corrupt func(b []byte) []byte
		reason  string
	}{
		{"a flipped bit", func(b []byte) []byte { b[5] ^= 1; return b }, "fails its CRC"},
		{"truncated", func(b []byte) []byte { return b[:len(b)/2] }, "fails its CRC"},
		{"empty", func([]byte) []byte { return nil }, "fails its CRC"},
		{"not JSON under a good CRC", func([]byte) []byte { return withCRC("{nope") }, "invalid character"},
		{"offsets that make no sense", func([]byte) []byte { return withCRC(`{"version":1,"flushed":10,"dispatched":20}`) }, "dispatched 20"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			opts := Options{Dir: dir, FileSize: 16 << 10, ConsumeQueueEntries: 64}
			s, err := Open(opts)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			for i := range 12 {
				b := &Batch{Topic: "CPR", QueueID: int32(i % 2)}
				for j := range 4 {
					b.Messages = append(b.Messages, BatchMessage{Body: batchBody(fmt.Sprint(i), j, 4, 500)})
				}
				if _, err := s.PutMessages(ctx, b); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			path := filepath.Join(dir, checkpointName)
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, tt.corrupt(b), 0o644); err != nil {
				t.Fatal(err)
			}

			_, err = Open(opts)
			var cperr *CheckpointError
			if !errors.As(err, &cperr) || cperr.File != path || !strings.Contains(cperr.Reason, tt.reason) || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open: %v; want a *CheckpointError for %s saying %q", err, path, tt.reason)
			}
			rep, err := Check(opts)
			if err != nil || rep.CheckpointFile != path || rep.CheckpointDamage == "" || rep.Damage != "" || rep.Records != 48 {
				t.Fatalf("Check: %+v, %v; want the checkpoint reported and 48 valid records", rep, err)
			}
			aside, err := RebuildCheckpoint(opts)
			if err != nil || !strings.HasPrefix(aside, "checkpoint.corrupt-") {
				t.Fatalf("RebuildCheckpoint: %q, %v", aside, err)
			}
			if _, err := os.Stat(filepath.Join(dir, aside)); err != nil {
				t.Fatalf("the old checkpoint is not kept: %v", err)
			}
			if rep, err := Check(opts); err != nil || rep.CheckpointDamage != "" || rep.Damage != "" || rep.Flushed != rep.End {
				t.Fatalf("Check after the rebuild: %+v, %v", rep, err)
			}
			s, err = Open(opts)
			if err != nil {
				t.Fatalf("Open after the rebuild: %v", err)
			}
			defer s.Close()
			seen := checkWholeBatches(t, s, "CPR", 2)
			if len(seen) != 12 {
				t.Fatalf("%d batches served after the rebuild, want 12", len(seen))
			}
			res, err := s.PutMessage(ctx, &Message{Topic: "CPR", QueueID: 1, Body: []byte("next")})
			if err != nil || res.Append.QueueOffset != 24 {
				t.Fatalf("put after the rebuild: %+v, %v; want queue offset 24", res.Append, err)
			}
		})
	}
}

// TestRebuildCheckpointRefusesDamage: with a corrupt checkpoint and a
// damaged record, RebuildCheckpoint refuses (it would cut the log there
// silently) and changes nothing; Repair at the damage offset cuts the log
// and replaces the checkpoint, setting the corrupt one aside.
func TestRebuildCheckpointRefusesDamage(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir, FileSize: 16 << 10}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	var offs []int64
	for i := range 20 {
		res, err := s.PutMessage(context.Background(), &Message{Topic: "RD", Body: fmt.Appendf(nil, "m%d-%s", i, strings.Repeat("z", 400))})
		if err != nil {
			t.Fatal(err)
		}
		offs = append(offs, res.Append.WroteOffset)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	cp := filepath.Join(dir, checkpointName)
	if err := os.WriteFile(cp, []byte("garbage\n1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	log := filepath.Join(dir, "commitlog", fileName(0))
	data, _ := os.ReadFile(log)
	data[offs[7]+100] ^= 0xff
	if err := os.WriteFile(log, data, 0o644); err != nil {
		t.Fatal(err)
	}
	rep, err := Check(opts)
	if err != nil || rep.CheckpointDamage == "" || rep.DamageOffset != offs[7] {
		t.Fatalf("Check: %+v, %v", rep, err)
	}
	if _, err := RebuildCheckpoint(opts); !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), fmt.Sprint(offs[7])) {
		t.Fatalf("RebuildCheckpoint over damage: %v; want a refusal naming offset %d", err, offs[7])
	}
	if b, _ := os.ReadFile(cp); string(b) != "garbage\n1\n" {
		t.Fatalf("a refused rebuild changed the checkpoint: %q", b)
	}
	if err := Repair(opts, offs[7]); err != nil {
		t.Fatal(err)
	}
	if aside, _ := filepath.Glob(filepath.Join(dir, "checkpoint.corrupt-*")); len(aside) != 1 {
		t.Fatalf("Repair did not set the corrupt checkpoint aside: %v", aside)
	}
	s, err = Open(opts)
	if err != nil {
		t.Fatalf("Open after Repair: %v", err)
	}
	defer s.Close()
	if msgs := pullQueue(t, s, "RD", 0); len(msgs) != 7 {
		t.Fatalf("%d messages after the cut, want 7", len(msgs))
	}
}

// TestRepairRefusesInsideBatch: Repair never leaves part of a batch (the
// next Open would find it torn below the rewritten checkpoint): an offset
// inside a batch is refused, naming the batch's start.
func TestRepairRefusesInsideBatch(t *testing.T) {
	dir := t.TempDir()
	opts := Options{Dir: dir, FileSize: 16 << 10}
	s, err := Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := s.PutMessage(ctx, &Message{Topic: "RB", Body: []byte("single")}); err != nil {
		t.Fatal(err)
	}
	b := &Batch{Topic: "RB"}
	for j := range 4 {
		b.Messages = append(b.Messages, BatchMessage{Body: batchBody("b", j, 4, 100)})
	}
	res, err := s.PutMessages(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	offs := res.Append.Offsets
	err = Repair(opts, offs[2])
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("inside the batch that starts at %d", offs[0])) {
		t.Fatalf("Repair inside a batch: %v", err)
	}
	if err := Repair(opts, offs[0]); err != nil {
		t.Fatalf("Repair at the batch's start: %v", err)
	}
	s, err = Open(opts)
	if err != nil {
		t.Fatalf("Open after Repair: %v", err)
	}
	defer s.Close()
	if msgs := pullQueue(t, s, "RB", 0); len(msgs) != 1 {
		t.Fatalf("%d messages after the cut, want the single one", len(msgs))
	}
}
