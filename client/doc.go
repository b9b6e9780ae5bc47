// Package client holds Go helpers for storaged clients. LeaderTracker
// sends puts to the ready leader of a replication group (design
// replication.md §1): given the members' client addresses, it remembers
// the leader, follows the leader_addr hints of refusals, finds the leader
// with GetReplicaInfo when no hint helps, and retries a put only when
// storaged said nothing was stored (Classify). Everything is bounded: at
// most MaxAttempts calls per put; while no member is the ready leader
// (an election, a transfer), lookups every LookupInterval for at most
// LeaderWait; a member that refused is asked again only after its
// RetryInfo (or a jittered backoff without one), while a put goes at once
// to another member that says it is the ready leader; connections to
// addresses outside the member list at most MaxHintedAddrs.
//
// The members of a group change (storaged replica add, remove): the
// tracker learns the client addresses of the members added since it was
// made from the membership the members report (GetReplicaInfo's
// membership.client_addrs), at every leader lookup and by asking the
// leader every RefreshInterval, and asks them too when looking for the
// leader. So a client configured with the members of a year ago still
// finds the leader after they were all replaced one by one, as long as it
// ran (and refreshed) while the group changed; a client started after the
// change needs at least one current member among its addresses.
//
// A lookup asks every address it knows at once (the members, the hinted
// and learned addresses) and takes the first that says it is the ready
// leader, in the term of the refusal that hinted or a later one (a
// deposed leader that has not heard yet says it leads in an earlier
// term). It does not wait for addresses it has no connection up to once
// every connected one has answered: a member that has gone from an
// address that drops packets (a deleted Kubernetes pod's) would hold it
// for the connection attempt's bound, a second, each time.
//
// What a put's error means for the message:
//
//   - nil: the message is stored (PUT_OK: committed on a majority of the
//     group, each member having synced it);
//   - an error NothingStored reports: no attempt was made (no ready
//     leader within LeaderWait, the tracker or stream closed, ctx ended
//     before the first send), or every attempt was refused before
//     anything was stored (the attempts ran out, or ctx ended meanwhile);
//     sending the message again cannot store it twice;
//   - anything else: the outcome is unknown; the message may be stored.
//     Retrying an unkeyed put may store it twice.
//
// Tell them apart with NothingStored, not with errors.Is(err,
// context.DeadlineExceeded): a put whose ctx ended while it waited for a
// leader stored nothing, one whose call was cut by its ctx may have, and
// a keyed put sent again after a call whose outcome was unknown, then cut
// short by its ctx, returns an error that holds both, the unknown call's
// status first. Classify reads one call's status (its NothingStored, the
// leader it names, its RetryInfo).
//
// Keyed puts are stored exactly once, and every put is keyed by default:
// the tracker gives each message without a UNIQ_KEY property one, on a
// copy of the request (Options.UniqKeys; UniqKeysAsGiven sends messages as
// given), as RocketMQ's producers do. A put whose message (a batch: its
// first message) carries a UNIQ_KEY is retried after an unknown outcome
// too: a deadline,
// AttemptTimeout (2 s per call), a broken connection, FLUSH_SLAVE_TIMEOUT.
// storaged answers a put of a key it holds with the first put's result;
// in a group every member keeps the keys of the committed log, and the
// leader keeps a key whose entry is not decided yet until raft decides
// it, so the retry, at whichever member leads then, is answered with the
// first call's result if that was stored and stored once if not. The
// retry is made only while less than half the dedup window that member
// reports (GetReplicaInfo's dedup_window: --dedup-window, shorter while
// --dedup-max-messages pushes keys out early) has passed since the put
// began; past it, or with deduplication off, the unknown outcome comes
// back as for an unkeyed put. A leader that stops answering (a paused
// process, a cut link) costs a keyed put about the group's election: once
// a call has waited LeaderCheckAfter (500 ms), the tracker asks the other
// members, every 100 ms while it waits, whether one is the ready leader in
// a later term than the member the call went to, and when one is, cuts the
// call and sends the put there (AttemptTimeout, 2 s per call, bounds the
// call when none is). An unkeyed put is never cut: it costs its whole
// deadline, and its outcome is unknown.
//
// A put is never sent to a member only named as the leader by another:
// the tracker sends it where a member itself answered that it is the
// ready leader, or to the member that took the last put. So a dead leader
// costs the puts in flight to it (unknown outcomes, but for keyed ones),
// not one per put until the followers notice.
//
// Stream (LeaderTracker.NewStream) sends single messages on
// PutMessageStreams to the ready leader, Puts of many goroutines sharing
// one gRPC stream, at most StreamOptions.MaxInFlight (256) sent and not
// answered (a Put waits for room, within its ctx). Each message's answer
// is its Put's: code 0 the response; code 14 UNAVAILABLE (nothing stored)
// doubts the member and sends the message again on a new stream to the
// leader, at most MaxAttempts sends; another code an error with that code
// and reason, as PutMessage returns it (a keyed message's unknown outcome
// retried as PutMessage would). A stream that breaks, or on which a keyed
// message waits longer than AttemptTimeout or until the leader check finds
// a later leader (then cut), leaves the messages
// unanswered on it with unknown outcomes: a keyed one is sent again on the
// next stream to the leader, within half its dedup window, an unkeyed one
// fails unknown. A stream that ended OK stored nothing it did not answer:
// those are sent again. Messages may be stored out of the order of the
// calls, and a message sent again after messages put later.
//
//	t, err := client.New(client.Options{Addrs: []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080"},
//		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(creds)}})
//	...
//	defer t.Close()
//	resp, err := t.PutMessage(ctx, &storagedv1.PutMessageRequest{Message: msg})
//
//	st, err := t.NewStream(client.StreamOptions{})
//	...
//	defer st.Close()
//	resp, err := st.Put(ctx, msg) // from many goroutines
package client
