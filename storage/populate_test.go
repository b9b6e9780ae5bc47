package storage

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/storaged/storaged/storage/vfs"
)

// TestPopulateModes: Options.Populate reaches the allocator: every mode
// but PopulateOff faults the files in (one OpPopulate per chunk), Off
// populates nothing, and in every mode the allocator still counts the files
// as done (WaitPopulated returns) and puts land. An unknown mode is refused.
func TestPopulateModes(t *testing.T) {
	for _, tc := range []struct {
		how      vfs.PopulateMode
		populate bool
	}{
		{vfs.PopulateWrite, true},
		{vfs.PopulateRead, true},
		{vfs.PopulateWillNeed, true},
		{vfs.PopulateOff, false},
		{vfs.PopulateZero, true},
	} {
		t.Run(tc.how.String(), func(t *testing.T) {
			fs := vfs.NewMem()
			var calls atomic.Int64
			fs.SetInjector(func(op vfs.Op, _ string) error {
				if op == vfs.OpPopulate {
					calls.Add(1)
				}
				return nil
			})
			s, err := Open(Options{Dir: "/d", FS: fs, FileSize: 64 << 10, MaxMessageSize: 1024,
				PopulateChunk: testChunk, Populate: tc.how})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for range 200 { // ~100 KiB: a roll into the second file
				if _, err := s.PutMessage(context.Background(), msg("T", strings.Repeat("x", 500))); err != nil {
					t.Fatal(err)
				}
			}
			s.log.WaitPopulated()
			if n := calls.Load(); (n > 0) != tc.populate {
				t.Errorf("%d populate calls, want some: %v", n, tc.populate)
			}
			if st := s.Stats(); st.Files < 2 {
				t.Errorf("%d files after 100 KiB of puts into 64 KiB files, want a roll", st.Files)
			}
		})
	}
	if _, err := Open(Options{Dir: t.TempDir(), Populate: vfs.PopulateZero + 1}); err == nil || !strings.Contains(err.Error(), "Populate") {
		t.Errorf("Open with an unknown Populate mode: %v, want an invalid-options error", err)
	}
}
