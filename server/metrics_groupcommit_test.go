package server

import (
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/rs/zerolog"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
	"github.com/storaged/storaged/storage"
)

// TestGroupCommitMetrics: the group commit's counters reach /metrics of a
// real server and move with the sync-mode puts made: every acked put is
// one wait, answered either by a sync (waiters) or at once because a sync
// had already covered it (already_durable), and both are counted before
// the put hears its answer, so their sum equals the puts acked at every
// scrape; syncs ran, and at most one gather ended per sync.
func TestGroupCommitMetrics(t *testing.T) {
	st, _ := openStore(t, func(o *storage.Options) { o.FlushMode = storage.FlushSync })
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewStoreCollector(st))
	srv := startServer(t, New(st, zerolog.Nop()), GRPCConfig{Registerer: reg})
	client := storagedv1.NewMessageStoreServiceClient(dial(t, srv.addr, nil))
	base := serveMetrics(t, reg)
	ctx := ctxT(t)
	put := func() {
		t.Helper()
		res, err := client.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: &storagedv1.Message{Topic: "gc", Body: []byte("hello")}})
		if err != nil {
			t.Error(err)
		} else if res.GetStatus() != storagedv1.PutMessageStatus_PUT_MESSAGE_STATUS_PUT_OK {
			t.Errorf("put: %v", res.GetStatus())
		}
	}
	type counts struct{ syncs, waiters, atOnce, complete, gaveUp, short, gather, ok float64 }
	read := func() counts {
		t.Helper()
		mfs := scrape(t, base)
		c := counts{
			syncs:    value(mfs, "storaged_group_commit_syncs_total"),
			waiters:  value(mfs, "storaged_group_commit_waiters_total"),
			atOnce:   value(mfs, "storaged_group_commit_already_durable_total"),
			complete: value(mfs, "storaged_group_commit_gathers_total", "outcome", "complete"),
			gaveUp:   value(mfs, "storaged_group_commit_gathers_total", "outcome", "gave_up"),
			short:    value(mfs, "storaged_group_commit_gathers_total", "outcome", "short"),
			gather:   value(mfs, "storaged_group_commit_gather_seconds_total"),
			ok:       value(mfs, "storaged_store_puts_total", "status", "PUT_OK"),
		}
		for name, typ := range map[string]dto.MetricType{
			"storaged_group_commit_syncs_total": dto.MetricType_COUNTER, "storaged_group_commit_waiters_total": dto.MetricType_COUNTER,
			"storaged_group_commit_already_durable_total": dto.MetricType_COUNTER,
			"storaged_group_commit_gathers_total":         dto.MetricType_COUNTER, "storaged_group_commit_gather_seconds_total": dto.MetricType_COUNTER,
		} {
			if mf := mfs[name]; mf == nil || mf.GetType() != typ || mf.GetHelp() == "" {
				t.Errorf("%s: %v, want a %v with help", name, mf, typ)
			}
		}
		return c
	}

	if c := read(); c != (counts{}) {
		t.Fatalf("before any put: %+v, want all 0", c)
	}

	check := func(phase string, prev, c counts, puts float64) {
		t.Helper()
		if c.ok != puts {
			t.Errorf("%s: PUT_OK %v, want %v", phase, c.ok, puts)
		}
		if c.waiters+c.atOnce != puts {
			t.Errorf("%s: waiters %v + already durable %v != %v puts acked", phase, c.waiters, c.atOnce, puts)
		}
		if c.syncs <= prev.syncs {
			t.Errorf("%s: syncs %v, before %v: no sync for the puts", phase, c.syncs, prev.syncs)
		}
		// A gather is counted before the sync after it: one may be under way.
		if g := c.complete + c.gaveUp + c.short; g > c.syncs+1 {
			t.Errorf("%s: %v gathers ended for %v syncs: at most one per sync", phase, g, c.syncs)
		}
		if c.gather < prev.gather {
			t.Errorf("%s: gather seconds went back: %v after %v", phase, c.gather, prev.gather)
		}
	}

	const sequential = 5
	for range sequential {
		put()
	}
	c := read()
	check("one at a time", counts{}, c, sequential)
	if c.waiters < 1 {
		t.Errorf("one at a time: no waiter answered by a sync")
	}

	const writers, each = 16, 10
	var wg sync.WaitGroup
	for range writers {
		wg.Go(func() {
			for range each {
				put()
			}
		})
	}
	wg.Wait()
	d := read()
	check("concurrent", c, d, sequential+writers*each)
	// Every put was acked before the scrape, so the waits are final; the
	// flusher may still sync after it (a gather that ends with nothing to
	// wait for), so Stats' later read may count more syncs, never fewer.
	s := st.Stats().GroupCommit
	if s == nil || float64(s.Released) != d.waiters || float64(s.AtOnce) != d.atOnce || float64(s.Syncs) < d.syncs {
		t.Errorf("metrics %+v disagree with Stats().GroupCommit %+v (read after them)", d, s)
	}
}

// TestGroupCommitMetricsAsync: an async store has no group commit, and
// /metrics shows none of its series.
func TestGroupCommitMetricsAsync(t *testing.T) {
	st, _ := openStore(t, nil)
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewStoreCollector(st))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if name := mf.GetName(); strings.HasPrefix(name, "storaged_group_commit_") {
			t.Errorf("async store exports %s", name)
		}
	}
	if st.Stats().GroupCommit != nil {
		t.Error("async store: Stats().GroupCommit not nil")
	}
}
