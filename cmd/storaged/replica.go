package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/storaged/storaged/server/peer"
	"github.com/storaged/storaged/storage"
)

// replicaRepairOutput is what `storaged replica repair` prints.
type replicaRepairOutput struct {
	DataDir     string                 `json:"data_dir"`
	Member      uint64                 `json:"member"`
	From        string                 `json:"from"`
	Entries     uint64                 `json:"entries_checked"`
	Commit      uint64                 `json:"commit"`
	PeerCommit  uint64                 `json:"peer_commit"`
	Damaged     []storageDamage        `json:"damaged"`
	Repaired    []uint64               `json:"repaired"`
	Bytes       int64                  `json:"bytes_rewritten"`
	MetaRebuilt bool                   `json:"meta_rebuilt,omitempty"`
	HardState   *hardStateOutput       `json:"hardstate_rebuilt,omitempty"`
	CutFrom     uint64                 `json:"cut_from,omitempty"`
	Peers       []storage.RepairAnswer `json:"peers,omitempty"`
	Error       string                 `json:"error,omitempty"`
}

type hardStateOutput struct {
	Term   uint64 `json:"term"`
	Vote   uint64 `json:"vote"`
	Commit uint64 `json:"commit"`
}

type storageDamage struct {
	Index uint64 `json:"index"`
	What  string `json:"what"`
	Torn  bool   `json:"torn,omitempty"`
}

// runReplica is `storaged replica SUBCOMMAND`: the offline tools of a
// replication group member.
func runReplica(args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	if len(args) > 0 {
		switch args[0] {
		case "members", "add", "promote", "remove", "transfer":
			return runReplicaMembership(args[0], args[1:], lookupEnv, stdout, stderr)
		}
	}
	if len(args) == 0 || args[0] != "repair" {
		fmt.Fprint(stderr, "Usage: storaged replica repair --from ID=HOST:PORT[,ID=HOST:PORT…] [--data-dir D] [--file-size S] "+
			"[--raft-id N --raft-peers P --raft-group G --raft-learners L] [--peer-tls-*]\n"+membersUsage)
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return exitOK
		}
		return exitUsage
	}
	return runReplicaRepair(args[1:], lookupEnv, stdout, stderr)
}

// runReplicaRepair is `storaged replica repair --from ID=HOST:PORT,…`
// (design replication.md §3.4): with this member stopped, it rebuilds a
// damaged raft/meta or a lost raft/hardstate from its peers (over the
// FetchState peer RPC), finds the raft entries of its data dir that fail
// their CRCs, fetches them from the first peer that holds the same entry
// (FetchRange), checks them and rewrites them in place, and cuts a
// damaged uncommitted entry that enough voters provably lack.
// Exit 0 when nothing is left damaged, 1 when the repair failed, 2 on a
// usage error, 3 when it could not run (locked data dir, not a member's).
func runReplicaRepair(args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("replica repair", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o offlineFlags
	o.register(fs)
	var from raftPeers
	fs.Var(&from, "from", "the members to ask, as `id=host:port` of their peer listeners (their --raft-peers entries), "+
		"comma separated, the leader first if known (default with --raft-peers: every other member)")
	var self replicationConfig
	self.GroupName = defaultGroupName
	fs.Func("raft-id", "this member's raft `id` (as the server's --raft-id): needed to rebuild a damaged raft/meta", func(s string) error {
		id, err := parseRaftIDFlag(s, os.Hostname)
		self.RaftID = id
		return err
	})
	fs.Var(&self.RaftPeers, "raft-peers", "the group's `members` (as the server's --raft-peers): with --raft-id, names this member's "+
		"group and cluster when raft/meta is damaged, and is checked against an intact one")
	fs.StringVar(&self.GroupName, "raft-group", defaultGroupName, "the group's `name` (as the server's --raft-group)")
	fs.Var(&self.RaftLearners, "raft-learners", "`ids` of the learners (as the server's --raft-learners)")
	var certFile, keyFile, caFile string
	fs.StringVar(&certFile, "peer-tls-cert", "", "peer TLS certificate `file` (PEM): this member's, as the server uses it")
	fs.StringVar(&keyFile, "peer-tls-key", "", "peer TLS private key `file` (PEM)")
	fs.StringVar(&caFile, "peer-tls-ca", "", "CA `file` (PEM) that signs the members' peer certificates")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this `duration`")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: storaged replica repair --from ID=HOST:PORT[,ID=HOST:PORT…] [--data-dir D] [--file-size S] "+
			"[--raft-id N --raft-peers P [--raft-group G] [--raft-learners L]] [--peer-tls-cert C --peer-tls-key K --peer-tls-ca A]\n\n"+
			"Repairs the raft state of a stopped replication group member that refuses to start because it is damaged.\n"+
			"raft/meta (who the member is): rebuilt from a peer's, with this member's id from --raft-id; every peer must\n"+
			"agree with what --raft-peers, --raft-group, --raft-learners and --file-size say.\n"+
			"raft/hardstate (term, vote, commit): rebuilt with the highest term of the peers and of the log, a vote for this\n"+
			"member itself (so it gives no second vote in that term) and the highest commit it shares with a peer; it needs\n"+
			"enough voters to answer that every majority including this member has one (3 voters: both peers; 5: three).\n"+
			"Raft entries: every entry is checked against its index unit's CRCs; a damaged one is fetched from the first\n"+
			"member --from names that holds the same entry (same index and term), every record's CRCs and offset are\n"+
			"checked, and the bytes are rewritten in place, synced. A damaged entry past the commit index that no member\n"+
			"holds is cut (kept as .broken) only when enough voters provably lack it that it cannot have been committed.\n"+
			"Once the group's membership has changed (raft/conf), the voters raft/meta names are not the group's: a lost\n"+
			"raft/meta or raft/hardstate and an uncommitted entry to cut are refused then; damaged entries are still repaired,\n"+
			"and --raft-peers/--raft-learners may name the current members (the cluster id comes from an intact raft/meta).\n"+
			"It refuses rather than guess (exit 1), naming the entry or file and the members it needs to hear from.\n"+
			"Afterwards start the member as usual and it rejoins.\n"+
			"Exit status: 0 repaired (or nothing to repair), 1 the repair failed, 2 usage error, 3 could not run.\n\n")
		fs.PrintDefaults()
	}
	if err := parseOffline(fs, args, lookupEnv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if len(from) == 0 && self.RaftID != 0 {
		for _, p := range self.RaftPeers {
			if p.id != self.RaftID {
				from = append(from, p)
			}
		}
	}
	if len(from) == 0 {
		fmt.Fprint(stderr, "storaged replica repair: --from ID=HOST:PORT is required (the leader first is best; with --raft-id "+
			"and --raft-peers every other member is the default)\n")
		return exitUsage
	}
	if (self.RaftID != 0) != (len(self.RaftPeers) > 0) {
		fmt.Fprint(stderr, "storaged replica repair: --raft-id and --raft-peers go together\n")
		return exitUsage
	}
	if self.RaftID != 0 && self.RaftPeers.addr(self.RaftID) == "" {
		fmt.Fprintf(stderr, "storaged replica repair: --raft-id %d is not in --raft-peers\n", self.RaftID)
		return exitUsage
	}
	if (certFile != "" || keyFile != "" || caFile != "") && (certFile == "" || keyFile == "" || caFile == "") {
		fmt.Fprint(stderr, "storaged replica repair: --peer-tls-cert, --peer-tls-key and --peer-tls-ca go together\n")
		return exitUsage
	}
	opts := o.options()
	// Who asks: the flags when given, raft/meta otherwise.
	var rr storage.ReplicaRepair
	var id uint64
	var group, cluster string
	if self.RaftID != 0 {
		// An intact raft/meta names the cluster: once the membership
		// changed, the flags (the current members) no longer digest to
		// the id the group was bootstrapped with, which its peers
		// check, and a joined member's id was never a digest of flags.
		if err := self.resolveCluster(o.dataDir); err != nil {
			fmt.Fprintf(stderr, "storaged replica repair: %v\n", err)
			return exitUsage
		}
		rr.Self = &storage.GroupOptions{ID: self.RaftID, Name: self.GroupName, ClusterID: self.groupClusterID(), Peers: self.voters(),
			Learners: slices.Clone(self.RaftLearners)}
		id, group, cluster = self.RaftID, self.GroupName, self.groupClusterID()
	} else {
		meta, err := storage.ReadReplicaMeta(opts)
		var cerr *storage.CorruptionError
		switch {
		case errors.Is(err, iofs.ErrNotExist):
			fmt.Fprintf(stderr, "storaged replica repair: data dir %s has no raft/meta: it is not a replication group member's "+
				"(if it is one whose raft/meta was lost, give --raft-id and --raft-peers as the member runs with)\n", o.dataDir)
			return exitCantRead
		case errors.As(err, &cerr):
			fmt.Fprintf(stderr, "storaged replica repair: %s is damaged: give this member's --raft-id, --raft-peers (and "+
				"--raft-group, --raft-learners) as it runs with, to rebuild it from a peer's\n", cerr.File)
			return exitUsage
		case err != nil:
			fmt.Fprintf(stderr, "storaged replica repair: %v\n", err)
			return exitCantRead
		}
		id, group, cluster = meta.NodeID, meta.Group, meta.ClusterUUID
	}
	for _, p := range from {
		if p.id == id {
			fmt.Fprintf(stderr, "storaged replica repair: --from names member %d, this member's own id\n", id)
			return exitUsage
		}
	}
	var tlsCfg *peer.TLS
	if certFile != "" {
		var err error
		if tlsCfg, err = peer.LoadTLS(certFile, keyFile, caFile); err != nil {
			fmt.Fprintf(stderr, "storaged replica repair: %v\n", err)
			return exitUsage
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	for _, p := range from {
		client, err := peer.NewRangeClient(peer.FetchOptions{Addr: p.addr, TLS: tlsCfg, Group: group, ClusterID: cluster, From: id, To: p.id})
		if err != nil {
			fmt.Fprintf(stderr, "storaged replica repair: %v\n", err)
			return exitUsage
		}
		defer client.Close()
		rr.Peers = append(rr.Peers, storage.RepairPeer{ID: p.id,
			State: func() (storage.ReplicaState, error) {
				st, err := client.State(ctx)
				return storage.ReplicaState{Meta: storage.ReplicaMeta{NodeID: st.NodeID, Group: st.Group, ClusterUUID: st.ClusterID,
					FileSize: st.FileSize, LogBase: st.LogBase, Voters: st.Voters, Learners: st.Learners},
					Term: st.Term, Commit: st.Commit, First: st.First, Last: st.Last, Joining: st.Joining}, err
			},
			Fetch: func(lo, hi uint64) (storage.RaftRange, error) {
				r, err := client.Fetch(ctx, lo, hi)
				out := storage.RaftRange{Commit: r.Commit, Last: r.Last}
				for _, e := range r.Entries {
					out.Entries = append(out.Entries, storage.RaftRangeEntry{Index: e.Index, Unit: e.Unit, Data: e.Data})
				}
				return out, err
			}})
	}
	rep, rerr := storage.RepairReplica(opts, rr)
	out := replicaRepairOutput{DataDir: o.dataDir, Member: id, From: from.String(), Entries: rep.Entries, Commit: rep.Commit,
		PeerCommit: rep.PeerCommit, Repaired: rep.Repaired, Bytes: rep.Bytes, Damaged: []storageDamage{},
		MetaRebuilt: rep.MetaRebuilt, CutFrom: rep.CutFrom, Peers: rep.Peers}
	if out.Repaired == nil {
		out.Repaired = []uint64{}
	}
	if h := rep.HardState; h != nil {
		out.HardState = &hardStateOutput{Term: h.Term, Vote: h.Vote, Commit: h.Commit}
	}
	for _, d := range rep.Damaged {
		out.Damaged = append(out.Damaged, storageDamage{Index: d.Index, What: d.What, Torn: d.Torn})
	}
	if rerr != nil {
		out.Error = offlineError(rerr, o.dataDir)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(stderr, "storaged replica repair: %v\n", err)
	}
	switch {
	case errors.Is(rerr, storage.ErrLocked):
		fmt.Fprintf(stderr, "storaged replica repair: %s\n", out.Error)
		return exitCantRead
	case rerr != nil:
		fmt.Fprintf(stderr, "storaged replica repair: %s\n", out.Error)
		return exitDamage
	}
	var did []string
	if rep.MetaRebuilt {
		did = append(did, "rebuilt raft/meta")
	}
	if h := rep.HardState; h != nil {
		did = append(did, fmt.Sprintf("rebuilt raft/hardstate (term %d, vote %d, commit %d)", h.Term, h.Vote, h.Commit))
	}
	if len(rep.Repaired) > 0 {
		did = append(did, fmt.Sprintf("rewrote %d entries (%d bytes)", len(rep.Repaired), rep.Bytes))
	}
	if rep.CutFrom != 0 {
		did = append(did, fmt.Sprintf("cut the log from entry %d (no member holds it and it cannot have been committed; "+
			"the units are kept in raft/index/*.broken)", rep.CutFrom))
	}
	if len(did) == 0 {
		fmt.Fprintf(stderr, "storaged replica repair: no damaged raft entry in %s (%d checked); nothing changed\n", o.dataDir, rep.Entries)
	} else {
		fmt.Fprintf(stderr, "storaged replica repair: %s; start storaged as usual\n", strings.Join(did, "; "))
	}
	return exitOK
}
