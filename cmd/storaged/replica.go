package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"time"

	"github.com/storaged/storaged/server/peer"
	"github.com/storaged/storaged/storage"
)

// replicaRepairOutput is what `storaged replica repair` prints.
type replicaRepairOutput struct {
	DataDir    string          `json:"data_dir"`
	Member     uint64          `json:"member"`
	From       string          `json:"from"`
	Entries    uint64          `json:"entries_checked"`
	Commit     uint64          `json:"commit"`
	PeerCommit uint64          `json:"peer_commit"`
	Damaged    []storageDamage `json:"damaged"`
	Repaired   []uint64        `json:"repaired"`
	Bytes      int64           `json:"bytes_rewritten"`
	Error      string          `json:"error,omitempty"`
}

type storageDamage struct {
	Index uint64 `json:"index"`
	What  string `json:"what"`
	Torn  bool   `json:"torn,omitempty"`
}

// runReplica is `storaged replica SUBCOMMAND`: the offline tools of a
// replication group member.
func runReplica(args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	if len(args) == 0 || args[0] != "repair" {
		fmt.Fprint(stderr, "Usage: storaged replica repair --from ID=HOST:PORT [--data-dir D] [--file-size S] [--peer-tls-*]\n")
		if len(args) > 0 && (args[0] == "-h" || args[0] == "--help" || args[0] == "help") {
			return exitOK
		}
		return exitUsage
	}
	return runReplicaRepair(args[1:], lookupEnv, stdout, stderr)
}

// runReplicaRepair is `storaged replica repair --from ID=HOST:PORT`
// (design replication.md §3.4): with this member stopped, it finds the raft
// entries of its data dir that fail their CRCs, fetches them from the peer
// over the FetchRange peer RPC, checks them and rewrites them in place.
// Exit 0 when nothing is left damaged, 1 when the repair failed, 2 on a
// usage error, 3 when it could not run (locked data dir, not a member's).
func runReplicaRepair(args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("replica repair", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o offlineFlags
	o.register(fs)
	var from raftPeers
	fs.Var(&from, "from", "the member to fetch from, as `id=host:port` of its peer listener (its --raft-peers entry); "+
		"prefer the leader, which holds every committed entry")
	var certFile, keyFile, caFile string
	fs.StringVar(&certFile, "peer-tls-cert", "", "peer TLS certificate `file` (PEM): this member's, as the server uses it")
	fs.StringVar(&keyFile, "peer-tls-key", "", "peer TLS private key `file` (PEM)")
	fs.StringVar(&caFile, "peer-tls-ca", "", "CA `file` (PEM) that signs the members' peer certificates")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up after this `duration`")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: storaged replica repair --from ID=HOST:PORT [--data-dir D] [--file-size S] [--peer-tls-cert C --peer-tls-key K --peer-tls-ca A]\n\n"+
			"Repairs the raft log of a stopped replication group member that refuses to start because entries it holds\n"+
			"are damaged (a bit flip in a committed record). It checks every raft entry of the data dir against its index\n"+
			"unit's CRCs, fetches the damaged ones from the member --from names (over the peer port, authenticated as\n"+
			"this member: group, cluster and id come from the data dir's raft/meta), takes an entry only when the peer's\n"+
			"is the same one (same index and term), checks every record's CRCs and offset, and rewrites the bytes in\n"+
			"place, synced. Nothing else changes; afterwards start the member as usual and it rejoins. It refuses rather\n"+
			"than guess (exit 1, naming the entry) when the peer lacks the entry or holds another one: try the leader.\n"+
			"Exit status: 0 repaired (or nothing to repair), 1 the repair failed, 2 usage error, 3 could not run.\n\n")
		fs.PrintDefaults()
	}
	if err := parseOffline(fs, args, lookupEnv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if len(from) != 1 {
		fmt.Fprint(stderr, "storaged replica repair: --from ID=HOST:PORT is required (one member: the leader is best)\n")
		return exitUsage
	}
	if (certFile != "" || keyFile != "" || caFile != "") && (certFile == "" || keyFile == "" || caFile == "") {
		fmt.Fprint(stderr, "storaged replica repair: --peer-tls-cert, --peer-tls-key and --peer-tls-ca go together\n")
		return exitUsage
	}
	opts := o.options()
	meta, err := storage.ReadReplicaMeta(opts)
	if err != nil {
		if errors.Is(err, iofs.ErrNotExist) {
			fmt.Fprintf(stderr, "storaged replica repair: data dir %s has no raft/meta: it is not a replication group member's\n", o.dataDir)
		} else {
			fmt.Fprintf(stderr, "storaged replica repair: %v\n", err)
		}
		return exitCantRead
	}
	if from[0].id == meta.NodeID {
		fmt.Fprintf(stderr, "storaged replica repair: --from names member %d, this data dir's own id\n", meta.NodeID)
		return exitUsage
	}
	var tlsCfg *peer.TLS
	if certFile != "" {
		if tlsCfg, err = peer.LoadTLS(certFile, keyFile, caFile); err != nil {
			fmt.Fprintf(stderr, "storaged replica repair: %v\n", err)
			return exitUsage
		}
	}
	client, err := peer.NewRangeClient(peer.FetchOptions{Addr: from[0].addr, TLS: tlsCfg, Group: meta.Group, ClusterID: meta.ClusterUUID,
		From: meta.NodeID, To: from[0].id})
	if err != nil {
		fmt.Fprintf(stderr, "storaged replica repair: %v\n", err)
		return exitUsage
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	rep, rerr := storage.RepairReplica(opts, func(lo, hi uint64) (storage.RaftRange, error) {
		r, err := client.Fetch(ctx, lo, hi)
		out := storage.RaftRange{Commit: r.Commit, Last: r.Last}
		for _, e := range r.Entries {
			out.Entries = append(out.Entries, storage.RaftRangeEntry{Index: e.Index, Unit: e.Unit, Data: e.Data})
		}
		return out, err
	})
	out := replicaRepairOutput{DataDir: o.dataDir, Member: meta.NodeID, From: from.String(), Entries: rep.Entries, Commit: rep.Commit,
		PeerCommit: rep.PeerCommit, Repaired: rep.Repaired, Bytes: rep.Bytes, Damaged: []storageDamage{}}
	if out.Repaired == nil {
		out.Repaired = []uint64{}
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
	if len(rep.Damaged) == 0 {
		fmt.Fprintf(stderr, "storaged replica repair: no damaged raft entry in %s (%d checked); nothing changed\n", o.dataDir, rep.Entries)
	} else {
		fmt.Fprintf(stderr, "storaged replica repair: rewrote %d entries (%d bytes) from member %d; start storaged as usual\n",
			len(rep.Repaired), rep.Bytes, from[0].id)
	}
	return exitOK
}
