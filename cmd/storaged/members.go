package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// exitRefused: the membership command's call failed or was refused.
const exitRefused = 1

// membersOutput is what `storaged replica members|add|promote|remove|
// transfer` print (JSON).
type membersOutput struct {
	Addr       string            `json:"addr"`
	ID         uint64            `json:"id,omitempty"`          // the member asked (members)
	Role       string            `json:"role,omitempty"`        // its role (members)
	LeaderID   uint64            `json:"leader_id,omitempty"`   // (members; transfer: the new leader)
	LeaderAddr string            `json:"leader_addr,omitempty"` // (transfer: its client address)
	ClusterID  string            `json:"cluster_id,omitempty"`
	Group      string            `json:"group,omitempty"`
	Index      uint64            `json:"index"`
	Voters     []uint64          `json:"voters"`
	Learners   []uint64          `json:"learners"`
	PeerAddrs  map[uint64]string `json:"peer_addrs"`
	// ClientAddrs (members): the members' client addresses the member
	// asked learned from their peer traffic (the leader knows them all).
	ClientAddrs map[uint64]string `json:"client_addrs,omitempty"`
	Removed     []uint64          `json:"removed,omitempty"`
	// Progress: the leader's view of each member (members, on the leader).
	Progress []memberProgress `json:"progress,omitempty"`
	// StartFlags (add): the flags the new member starts with.
	StartFlags string `json:"start_flags,omitempty"`
	Next       string `json:"next,omitempty"`
}

type memberProgress struct {
	ID           uint64 `json:"id"`
	Match        uint64 `json:"match"`
	Learner      bool   `json:"learner,omitempty"`
	RecentActive bool   `json:"recent_active"`
}

const membersUsage = "Usage:\n" +
	"  storaged replica members --addr HOST:PORT            the group's membership and cluster id, as a member applied it\n" +
	"                                                       (HOST:PORT: its client gRPC address, --listen)\n" +
	"  storaged replica add     --addr ADMIN --id N --peer-addr HOST:PORT\n" +
	"                                                       add member N as a learner; prints the flags it starts with\n" +
	"  storaged replica promote --addr ADMIN --id N         make learner N a voter once it has caught up\n" +
	"  storaged replica remove  --addr ADMIN --id N         remove member N for good (its id is never used again)\n" +
	"  storaged replica transfer --addr ADMIN [--id N]      move the leadership to voter N (default: the most caught-up\n" +
	"                                                       active voter); puts are refused (TRANSFERRING) while it runs\n" +
	"ADMIN is the leader's admin address (--admin-listen). Plaintext gRPC unless --tls: with a member's --tls-cert,\n" +
	"add --tls --tls-ca-cert CA.pem, and with its --tls-client-ca also --tls-client-cert C.pem --tls-client-key K.pem\n" +
	"(the flags of storaged health). Exit status: 0 done, 1 refused or failed (the error names why and, when the\n" +
	"member asked is not the leader, the leader), 2 usage error.\n"

// runReplicaMembership is `storaged replica members|add|promote|remove|
// transfer`.
func runReplicaMembership(cmd string, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("replica "+cmd, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() { fmt.Fprint(fs.Output(), membersUsage+"\n"); fs.PrintDefaults() }
	defAddr, what := "127.0.0.1:9092", "admin gRPC `address` (--admin-listen) of the group's leader"
	if cmd == "members" {
		defAddr, what = "127.0.0.1:9090", "client gRPC `address` (--listen) of a member"
	}
	addr := fs.String("addr", defAddr, what)
	var id uint64
	var peerAddr string
	if cmd != "members" {
		what := "the member's raft `id`"
		if cmd == "transfer" {
			what = "the raft `id` of the voter to lead (default: the most caught-up voter the leader heard from recently)"
		}
		fs.Func("id", what, func(s string) error {
			v, err := strconv.ParseUint(s, 10, 64)
			if err != nil || v == 0 {
				return fmt.Errorf("raft id %q: want a positive integer", s)
			}
			id = v
			return nil
		})
	}
	if cmd == "add" {
		fs.StringVar(&peerAddr, "peer-addr", "", "the new member's peer `address` (host:port of its --peer-listen)")
	}
	timeout := fs.Duration("timeout", 30*time.Second, "give up after this `duration` (a change waits for the group to apply it)")
	var tlsFlags clientTLS
	tlsFlags.register(fs)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	_ = lookupEnv // the flags of these commands have no environment twins: STORAGED_* configures the server
	if fs.NArg() > 0 || *timeout <= 0 || (cmd != "members" && cmd != "transfer" && id == 0) || (cmd == "add" && peerAddr == "") {
		fmt.Fprintf(stderr, "storaged replica %s: unexpected arguments, a non-positive --timeout, or a missing --id or --peer-addr\n%s", cmd, membersUsage)
		return exitUsage
	}
	if cmd == "add" {
		if err := checkHostPort(peerAddr, false); err != nil {
			fmt.Fprintf(stderr, "storaged replica add: --peer-addr: %v\n", err)
			return exitUsage
		}
	}
	creds, err := tlsFlags.creds()
	if err != nil {
		fmt.Fprintf(stderr, "storaged replica %s: %v\n", cmd, err)
		return exitUsage
	}
	conn, err := grpc.NewClient(*addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		fmt.Fprintf(stderr, "storaged replica %s: %s: %v\n", cmd, *addr, err)
		return exitUsage
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	out := membersOutput{Addr: *addr}
	admin := storagedv1.NewAdminServiceClient(conn)
	var m *storagedv1.ReplicaMembership
	switch cmd {
	case "members":
		ri, err := storagedv1.NewMessageStoreServiceClient(conn).GetReplicaInfo(ctx, &storagedv1.GetReplicaInfoRequest{})
		if err != nil {
			return rpcFailed(stderr, cmd, *addr, tlsFlags.on, err)
		}
		if ri.GetRole() == storagedv1.ReplicaRole_REPLICA_ROLE_STANDALONE {
			fmt.Fprintf(stderr, "storaged replica members: %s is standalone (no replication group)\n", *addr)
			return exitRefused
		}
		if ri.GetMembership() == nil {
			fmt.Fprintf(stderr, "storaged replica members: %s has not opened its store yet; retry shortly\n", *addr)
			return exitRefused
		}
		m = ri.GetMembership()
		out.ID, out.LeaderID, out.ClusterID, out.Group = ri.GetId(), ri.GetLeaderId(), ri.GetClusterId(), ri.GetGroup()
		out.Role = strings.ToLower(strings.TrimPrefix(ri.GetRole().String(), "REPLICA_ROLE_"))
		for _, p := range ri.GetPeers() {
			out.Progress = append(out.Progress, memberProgress{ID: p.GetId(), Match: p.GetMatch(), Learner: p.GetLearner(),
				RecentActive: p.GetRecentActive()})
		}
	case "add":
		resp, err := admin.AddReplicaMember(ctx, &storagedv1.AddReplicaMemberRequest{Id: id, PeerAddr: peerAddr})
		if err != nil {
			return rpcFailed(stderr, cmd, *addr, tlsFlags.on, err)
		}
		m, out.ClusterID, out.Group = resp.GetMembership(), resp.GetClusterId(), resp.GetGroup()
		out.StartFlags = startFlags(id, peerAddr, resp.GetGroup(), resp.GetClusterId(), m.GetPeerAddrs())
		out.Next = fmt.Sprintf("start member %d with start_flags (and an empty --data-dir); once it has caught up "+
			"(storaged replica members on the leader: its match near the others'), run: storaged replica promote --addr %s --id %d",
			id, *addr, id)
	case "promote":
		resp, err := admin.PromoteReplicaMember(ctx, &storagedv1.PromoteReplicaMemberRequest{Id: id})
		if err != nil {
			return rpcFailed(stderr, cmd, *addr, tlsFlags.on, err)
		}
		m = resp.GetMembership()
	case "remove":
		resp, err := admin.RemoveReplicaMember(ctx, &storagedv1.RemoveReplicaMemberRequest{Id: id})
		if err != nil {
			return rpcFailed(stderr, cmd, *addr, tlsFlags.on, err)
		}
		m = resp.GetMembership()
		out.Next = fmt.Sprintf("member %d stops once it applies its removal; its data dir never starts again", id)
	case "transfer":
		resp, err := admin.TransferReplicaLeadership(ctx, &storagedv1.TransferReplicaLeadershipRequest{Id: id})
		if err != nil {
			return rpcFailed(stderr, cmd, *addr, tlsFlags.on, err)
		}
		m, out.LeaderID, out.LeaderAddr = resp.GetMembership(), resp.GetLeaderId(), resp.GetLeaderAddr()
		out.Next = fmt.Sprintf("member %d leads; membership changes and later transfers go to its admin listener", out.LeaderID)
	}
	out.Index, out.Voters, out.Learners, out.Removed = m.GetIndex(), m.GetVoters(), m.GetLearners(), m.GetRemoved()
	out.PeerAddrs, out.ClientAddrs = m.GetPeerAddrs(), m.GetClientAddrs()
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(stderr, "storaged replica %s: %v\n", cmd, err)
		return exitRefused
	}
	return exitOK
}

// startFlags are the flags a member added with AddReplicaMember starts
// with: its id, the group, the cluster to join, and --raft-peers listing
// itself first and every member whose peer address is known.
func startFlags(id uint64, peerAddr, group, cluster string, addrs map[uint64]string) string {
	peers := []string{fmt.Sprintf("%d=%s", id, peerAddr)}
	for _, p := range slices.Sorted(maps.Keys(addrs)) {
		if p != id {
			peers = append(peers, fmt.Sprintf("%d=%s", p, addrs[p]))
		}
	}
	return fmt.Sprintf("--raft-id %d --raft-group %s --raft-join %s --raft-peers %s", id, group, cluster, strings.Join(peers, ","))
}

// rpcFailed prints a failed call with its status details (the leader
// hint of a "not leader" answer, the cause of a refusal), and a hint
// about --tls when a plaintext call got no answer from storaged.
func rpcFailed(stderr io.Writer, cmd, addr string, tlsOn bool, err error) int {
	st := status.Convert(err)
	fmt.Fprintf(stderr, "storaged replica %s: %s: %s: %s\n", cmd, addr, st.Code(), st.Message())
	if !tlsOn && st.Code() == codes.Unavailable && len(st.Details()) == 0 {
		// A member with --tls-cert closes a plaintext connection: "error
		// reading server preface: EOF" is all the call sees.
		fmt.Fprintln(stderr, "  this call was plaintext: a member with --tls-cert needs --tls --tls-ca-cert FILE "+
			"(and --tls-client-cert/--tls-client-key when it has --tls-client-ca)")
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok {
			keys := slices.Sorted(maps.Keys(info.GetMetadata()))
			var kv []string
			for _, k := range keys {
				kv = append(kv, k+"="+info.GetMetadata()[k])
			}
			fmt.Fprintf(stderr, "  reason %s %s\n", info.GetReason(), strings.Join(kv, " "))
		}
	}
	return exitRefused
}
