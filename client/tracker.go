package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	storagedv1 "github.com/storaged/storaged/gen/storaged/v1"
)

// Limits on Options.
const (
	// MaxMembers bounds Options.Addrs (a group has 3 or 5 members).
	MaxMembers = 16
	// MaxAttemptsLimit bounds Options.MaxAttempts.
	MaxAttemptsLimit = 100
)

// Errors.
var (
	// ErrNoLeader: no member said it is the ready leader within the
	// attempts; nothing was sent to a leader by the last attempt.
	ErrNoLeader = errors.New("client: no ready leader found")
	// ErrClosed: the tracker is closed.
	ErrClosed = errors.New("client: closed")
)

// Options configure a LeaderTracker. Zero values take the defaults.
type Options struct {
	// Addrs are the members' client gRPC addresses (host:port). Required,
	// at most MaxMembers.
	Addrs []string
	// DialOptions are used for every connection, after the tracker's own:
	// plaintext (insecure credentials, for loopback: pass TLS credentials
	// otherwise) and a reconnect backoff capped at 1 s (gRPC's default
	// grows to 120 s, and a restarted member may be the next leader).
	DialOptions []grpc.DialOption
	// MaxAttempts bounds the calls one put makes. Default 10.
	MaxAttempts int
	// InitialBackoff is the first wait after a refusal that carries no
	// RetryInfo; it doubles up to MaxBackoff, with jitter. Defaults 25 ms
	// and 1 s.
	InitialBackoff, MaxBackoff time.Duration
	// LookupInterval is the wait between leader lookups that find no ready
	// leader (an election or a transfer runs), LeaderWait their bound per
	// put. Defaults 20 ms and 5 s (an election after a leader dies takes
	// one to two election timeouts, 1-2 s by default, plus a round).
	LookupInterval, LeaderWait time.Duration
	// MaxRetryDelay caps a server's RetryInfo. Default 5 s.
	MaxRetryDelay time.Duration
	// ProbeTimeout bounds each GetReplicaInfo of a leader lookup. Default 1 s.
	ProbeTimeout time.Duration
	// MaxHintedAddrs bounds the connections to addresses that are not in
	// Addrs: leader addresses learnt from refusals (a member's advertised
	// address may differ from the one dialled) and members learnt from the
	// group's membership (RefreshInterval). Default 8; beyond it a
	// connection no put or probe uses, to an address neither the leader
	// nor in the newest membership, is closed to make room, and without
	// one the new address is ignored.
	MaxHintedAddrs int
	// RefreshInterval is how often the tracker asks the leader it sends
	// puts to for the group's membership (GetReplicaInfo), to learn the
	// client addresses of members added since it was made; every leader
	// lookup learns them too. So when every member given in Addrs is gone
	// or paused (replaced one by one), lookups still reach the members
	// that lead now. A leader that answers it no longer leads is
	// forgotten at once. Default 30 s.
	RefreshInterval time.Duration
	// AttemptTimeout bounds each call of a keyed put (one whose message,
	// or a batch's first message, carries a UNIQ_KEY property): such a put
	// is retried after an unknown outcome too (see PutMessage), so a
	// leader that stops answering (paused, cut off) costs it this long
	// plus an election, not its whole deadline. Default 2 s; negative: no
	// bound but the caller's ctx. Other puts are never cut short: their
	// outcome would only become unknown sooner.
	AttemptTimeout time.Duration
	// LeaderCheckAfter is how long a keyed send waits for its answer
	// before the tracker checks whether leadership moved: it asks the
	// other members (GetReplicaInfo), again every 100 ms while the send
	// waits, and if one says it is the ready leader in a later term than
	// the member the send went to, the send is cut (its outcome unknown)
	// and sent again there at once, with its key. So a leader that stops
	// answering costs a keyed put about the group's election, not
	// AttemptTimeout. Default 500 ms; negative: no checks.
	LeaderCheckAfter time.Duration
	// UniqKeys says which messages are keyed. By default
	// (UniqKeysStamped) every message without a UNIQ_KEY property gets one,
	// so every put is retried after an unknown outcome and stored exactly
	// once; UniqKeysAsGiven sends messages as given.
	UniqKeys UniqKeyMode
}

// UniqKeyMode says which messages a LeaderTracker keys (Options.UniqKeys).
type UniqKeyMode int

const (
	// UniqKeysStamped, the default, gives every message without a
	// UNIQ_KEY property one (32 hexadecimal digits, as RocketMQ's
	// producers always write: a random prefix per tracker and a counter),
	// in a copy of the request (the body and other fields shared, the
	// properties copied): every put is keyed, as with Kafka's idempotent
	// producer, the default there too. A key costs the message 45 bytes
	// of properties and the store a dedup window entry (storaged's
	// --dedup-max-messages bounds them; past the bound the window, which
	// GetReplicaInfo reports, gets shorter).
	UniqKeysStamped UniqKeyMode = iota
	// UniqKeysAsGiven sends messages as given: only those the caller keyed
	// are retried after an unknown outcome, the others come back with it.
	UniqKeysAsGiven
)

// UniqKeyProperty is the property that keys a put (RocketMQ's UNIQ_KEY,
// storage.PropertyUniqKey): storaged stores a put of the same key on the
// same topic once within its dedup window. maxUniqKeyLen is the longest
// it takes.
const (
	UniqKeyProperty = "UNIQ_KEY"
	maxUniqKeyLen   = 128
)

// maxAddrLen bounds an address a server names (a hint or a member's
// client address), as storaged bounds the ones its peers send.
const maxAddrLen = 256

func (o *Options) withDefaults() {
	if o.MaxAttempts == 0 {
		o.MaxAttempts = 10
	}
	if o.InitialBackoff == 0 {
		o.InitialBackoff = 25 * time.Millisecond
	}
	if o.MaxBackoff == 0 {
		o.MaxBackoff = time.Second
	}
	if o.LookupInterval == 0 {
		o.LookupInterval = 20 * time.Millisecond
	}
	if o.LeaderWait == 0 {
		o.LeaderWait = 5 * time.Second
	}
	if o.MaxRetryDelay == 0 {
		o.MaxRetryDelay = 5 * time.Second
	}
	if o.ProbeTimeout == 0 {
		o.ProbeTimeout = time.Second
	}
	if o.MaxHintedAddrs == 0 {
		o.MaxHintedAddrs = 8
	}
	if o.RefreshInterval == 0 {
		o.RefreshInterval = 30 * time.Second
	}
	if o.AttemptTimeout == 0 {
		o.AttemptTimeout = 2 * time.Second
	}
	if o.LeaderCheckAfter == 0 {
		o.LeaderCheckAfter = 500 * time.Millisecond
	}
	o.DialOptions = append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6,
			Jitter: 0.2, MaxDelay: time.Second}, MinConnectTimeout: time.Second})}, o.DialOptions...)
}

func (o *Options) validate() error {
	var errs []error
	if len(o.Addrs) == 0 || len(o.Addrs) > MaxMembers {
		errs = append(errs, fmt.Errorf("client: %d member addresses, want 1 to %d", len(o.Addrs), MaxMembers))
	}
	if o.UniqKeys != UniqKeysStamped && o.UniqKeys != UniqKeysAsGiven {
		errs = append(errs, fmt.Errorf("client: UniqKeys %d, want UniqKeysStamped or UniqKeysAsGiven", o.UniqKeys))
	}
	if slices.Contains(o.Addrs, "") {
		errs = append(errs, errors.New("client: an empty member address"))
	}
	if o.MaxAttempts < 1 || o.MaxAttempts > MaxAttemptsLimit {
		errs = append(errs, fmt.Errorf("client: MaxAttempts %d, want 1 to %d", o.MaxAttempts, MaxAttemptsLimit))
	}
	if o.InitialBackoff < 0 || o.MaxBackoff < o.InitialBackoff || o.MaxRetryDelay < 0 || o.ProbeTimeout < 0 || o.MaxHintedAddrs < 0 ||
		o.LookupInterval < 0 || o.LeaderWait < 0 || o.RefreshInterval < 0 {
		errs = append(errs, errors.New("client: negative durations or limits, or MaxBackoff below InitialBackoff"))
	}
	return errors.Join(errs...)
}

// LeaderTracker sends puts to the ready leader of a storaged replication
// group (design replication.md §1). It remembers the leader; after a
// refusal it follows the leader_addr hint, or asks every member
// (GetReplicaInfo) which one is the ready leader, and retries the put
// there, but only a put storaged refused with nothing stored (Classify).
// It learns the members added to the group since it was made from the
// membership the members report, and asks them too.
// A put whose outcome is unknown (a broken connection, a deadline, a
// replication timeout) comes back to the caller as it failed, and the
// next put looks the leader up again. Safe for concurrent use; one lookup
// runs at a time and the others wait for its answer.
type LeaderTracker struct {
	opts    Options
	members []string

	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
	refs   map[string]int // calls and probes using each connection now
	hinted int            // connections to addresses outside members
	leader string         // "" until a lookup finds one; cleared on doubt
	lookup *lookupCall
	closed bool
	// learned: the client addresses outside members of the newest
	// membership a member reported (memIndex, the raft index of its
	// change), at most MaxMembers.
	learned  []string
	memIndex uint64
	// windows: the dedup window each address reported at its last probe
	// (GetReplicaInfo's dedup_window; 0: off or not said), for the
	// addresses with a connection.
	windows map[string]time.Duration
	// terms: the term each address reported at its last probe, for the
	// addresses with a connection; a leader check deposes an address only
	// for a ready leader in a later term.
	terms map[string]uint64
	// watches: the keyed sends waiting longer than LeaderCheckAfter, by
	// the address they went to; checking: the check loop runs.
	watches  map[string]map[*stallWatch]struct{}
	checking bool

	// keyPrefix and keySeq make UniqKeysStamped's keys.
	keyPrefix string
	keySeq    atomic.Uint64

	ctx    context.Context // cancelled by Close: cuts lookups and waits short
	cancel context.CancelFunc
	wg     sync.WaitGroup // lookups in flight and the refresh loop

	// retryWait, if set (tests), is called when a put is about to wait
	// before its next lookup or send (a backoff, a RetryInfo,
	// LookupInterval), so a test can end the put's ctx in that wait.
	retryWait func()
}

// lookupCall is one leader lookup in flight; done is closed with addr
// (or err) set.
type lookupCall struct {
	done chan struct{}
	// minTerm: a ready leader in an earlier term is not taken (a refusal
	// that hinted at the leader named this term: a member claiming to
	// lead in an earlier one has been deposed and does not know yet).
	minTerm uint64
	addr    string
	err     error
}

// New returns a tracker over the members' addresses. Connections are made
// lazily; Close closes them.
func New(opts Options) (*LeaderTracker, error) {
	opts.withDefaults()
	if err := opts.validate(); err != nil {
		return nil, err
	}
	t := &LeaderTracker{opts: opts, members: slices.Clone(opts.Addrs), conns: map[string]*grpc.ClientConn{}, refs: map[string]int{},
		windows: map[string]time.Duration{}, terms: map[string]uint64{}, watches: map[string]map[*stallWatch]struct{}{},
		keyPrefix: fmt.Sprintf("%016X", rand.Uint64())}
	t.ctx, t.cancel = context.WithCancel(context.Background())
	for _, a := range t.members {
		if _, ok := t.conns[a]; ok {
			continue
		}
		c, err := grpc.NewClient(a, opts.DialOptions...)
		if err != nil {
			t.Close()
			return nil, fmt.Errorf("client: %s: %w", a, err)
		}
		t.conns[a] = c
	}
	t.wg.Add(1)
	go t.refreshLoop()
	return t, nil
}

// Close stops the lookups and the refresh loop, waits for them and closes
// every connection; calls in flight fail.
func (t *LeaderTracker) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.cancel()
	t.mu.Unlock()
	t.wg.Wait()
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	for _, c := range t.conns {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}

// Leader is the address puts go to now ("" until known).
func (t *LeaderTracker) Leader() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.leader
}

// Addrs are the addresses a leader lookup asks: the ones given (in
// order), then, sorted, those learned from the group's membership and
// from refusals' hints.
func (t *LeaderTracker) Addrs() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.addrsLocked()
}

// addrsLocked is Addrs. REQUIRES: t.mu.
func (t *LeaderTracker) addrsLocked() []string {
	addrs := slices.Clone(t.members)
	given := len(addrs)
	for a := range t.conns {
		if !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	slices.Sort(addrs[given:])
	return addrs
}

// PutMessage sends a put to the leader, retrying refusals that stored
// nothing. A keyed put (its message carries a UNIQ_KEY property: by
// default the tracker gives every message one, Options.UniqKeys) is
// retried after an unknown outcome too (a deadline, AttemptTimeout, a
// broken connection, FLUSH_SLAVE_TIMEOUT), at whichever
// member leads then, within half the dedup window that member reported
// (GetReplicaInfo's dedup_window) since the put began: storaged answers
// the retry with the first put's result when that was stored, and stores
// it once when not, also across a failover. So a keyed put that returns
// nil was stored exactly once. A keyed call that waits LeaderCheckAfter
// makes the tracker check whether another member leads now; if one does,
// in a later term, the call is cut and the put sent there. The error is
// the last call's, wrapped (status.Code and Classify see through it);
// once a call's outcome was unknown, the error says so whatever the later
// calls answered.
func (t *LeaderTracker) PutMessage(ctx context.Context, req *storagedv1.PutMessageRequest, opts ...grpc.CallOption) (*storagedv1.PutMessageResponse, error) {
	if t.opts.UniqKeys == UniqKeysStamped && req.GetMessage() != nil && !keyed(req.GetMessage().GetProperties()) {
		req = &storagedv1.PutMessageRequest{Message: withKey(req.GetMessage(), t.newKey())}
	}
	var resp *storagedv1.PutMessageResponse
	err := t.do(ctx, keyed(req.GetMessage().GetProperties()), func(ctx context.Context, c storagedv1.MessageStoreServiceClient) error {
		var err error
		resp, err = c.PutMessage(ctx, req, opts...)
		return err
	})
	return resp, err
}

// PutMessages is PutMessage for a batch (one entry, all or nothing),
// keyed by its first message's UNIQ_KEY.
func (t *LeaderTracker) PutMessages(ctx context.Context, req *storagedv1.PutMessagesRequest, opts ...grpc.CallOption) (*storagedv1.PutMessagesResponse, error) {
	if t.opts.UniqKeys == UniqKeysStamped && slices.ContainsFunc(req.GetMessages(), func(e *storagedv1.BatchEntry) bool { return !keyed(e.GetProperties()) }) {
		c := &storagedv1.PutMessagesRequest{Topic: req.GetTopic(), QueueId: req.GetQueueId(), Messages: slices.Clone(req.GetMessages())}
		for i, e := range c.Messages {
			if !keyed(e.GetProperties()) {
				c.Messages[i] = withKey(e, t.newKey())
			}
		}
		req = c
	}
	var first *storagedv1.BatchEntry
	if len(req.GetMessages()) > 0 {
		first = req.GetMessages()[0]
	}
	var resp *storagedv1.PutMessagesResponse
	err := t.do(ctx, keyed(first.GetProperties()), func(ctx context.Context, c storagedv1.MessageStoreServiceClient) error {
		var err error
		resp, err = c.PutMessages(ctx, req, opts...)
		return err
	})
	return resp, err
}

// keyed: props carry a UNIQ_KEY storaged deduplicates on.
func keyed(props map[string]string) bool {
	k := props[UniqKeyProperty]
	return k != "" && len(k) <= maxUniqKeyLen
}

// newKey is a UNIQ_KEY for UniqKeysStamped: 32 hexadecimal digits, the
// tracker's random prefix and a counter.
func (t *LeaderTracker) newKey() string {
	return fmt.Sprintf("%s%016X", t.keyPrefix, t.keySeq.Add(1))
}

// withKey returns a copy of m (a Message or a BatchEntry: its fields
// shared, its properties copied) whose UNIQ_KEY is key.
func withKey[M proto.Message](m M, key string) M {
	src := m.ProtoReflect()
	dst := src.New()
	props := dst.Descriptor().Fields().ByName("properties")
	src.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd != props {
			dst.Set(fd, v)
		}
		return true
	})
	pm := dst.Mutable(props).Map()
	if src.Has(props) {
		src.Get(props).Map().Range(func(k protoreflect.MapKey, v protoreflect.Value) bool {
			pm.Set(k, v)
			return true
		})
	}
	pm.Set(protoreflect.ValueOfString(UniqKeyProperty).MapKey(), protoreflect.ValueOfString(key))
	return dst.Interface().(M)
}

// Do runs call against the leader with the put retry rule: call may be
// run again, at the same or another member, only after an error Classify
// says stored nothing. call must make exactly one RPC.
//
// After a refusal the leader is looked up again (the refusal's hint
// first). The refusal's RetryInfo (or, without one, the backoff) is when
// the same member may be asked again: a member that stepped down names no
// leader and suggests about an election timeout, but the put goes to
// whichever member says it is the ready leader first, at once. Bounds: at
// most MaxAttempts calls, and, while no member says it is the ready
// leader (an election, a transfer), lookups every LookupInterval for at
// most LeaderWait in all.
func (t *LeaderTracker) Do(ctx context.Context, call func(context.Context, storagedv1.MessageStoreServiceClient) error) error {
	return t.do(ctx, false, call)
}

// do is Do; a keyed call is also retried after an unknown outcome, within
// the target's dedup window (PutMessage), each call within AttemptTimeout.
func (t *LeaderTracker) do(ctx context.Context, keyed bool, call func(context.Context, storagedv1.MessageStoreServiceClient) error) error {
	r := t.newRetry()
	var hint string
	// minTerm is the latest term a refusal named the leader in, kept for
	// the whole call: a lookup that finds no leader in it (the hinted
	// member's probe was cut, its connection not up yet) is followed by
	// another, and that one must not take the deposed leader, which still
	// says it leads in its older term.
	var minTerm uint64
	for {
		addr, conn, err := t.target(ctx, hint, minTerm)
		hint = ""
		var delay time.Duration
		switch {
		case errors.Is(err, ErrNoLeader):
			if delay, err = r.noLeader(err); err != nil {
				return err
			}
		case err != nil: // ctx ended, closed
			return r.fail(errors.Join(err, r.last))
		case r.hold(addr) > 0:
			t.release(addr)
			delay = r.hold(addr) // the same member: honour its RetryInfo
		case r.uncovered(addr):
			t.release(addr)
			return r.unknown
		default:
			more := r.sent()
			actx, cancel := ctx, context.CancelFunc(func() {})
			stop := func() string { return "" }
			if keyed {
				if t.opts.AttemptTimeout > 0 {
					actx, cancel = context.WithTimeout(ctx, t.opts.AttemptTimeout)
				} else {
					actx, cancel = context.WithCancel(ctx)
				}
				stop = t.watchSend(addr, func(string) { cancel() })
			}
			err = call(actx, storagedv1.NewMessageStoreServiceClient(conn))
			moved := stop()
			cancel()
			t.release(addr)
			if err == nil {
				return nil
			}
			if moved != "" {
				err = fmt.Errorf("%w (cut: %s leads in a later term)", err, moved)
			}
			v := Classify(err)
			t.doubt(addr) // the next call looks the leader up first
			if v.LeaderAddr != addr {
				hint, minTerm = v.LeaderAddr, max(minTerm, v.Term)
			}
			if !v.NothingStored {
				err = fmt.Errorf("client: put at %s (attempt %d), %w: %w", addr, r.attempt, errOutcomeUnknown, err)
				if !keyed || ctx.Err() != nil || !unknownRetried(err) || !more {
					return r.fail(err)
				}
				// A keyed put: the same again, at the member that leads
				// now (a lookup; the same member after a backoff: it waits
				// there for the first call's entry to be decided).
				r.unknownOutcome(addr, err, true)
				continue
			}
			err = fmt.Errorf("client: put refused at %s (attempt %d), nothing stored: %w", addr, r.attempt, err)
			if !more {
				return r.fail(err)
			}
			r.refused(addr, err, v.RetryDelay, v.HasRetryDelay)
		}
		if err := r.wait(ctx, t.ctx, delay); err != nil {
			return err
		}
	}
}

// unknownRetried: an unknown outcome a keyed put is retried after (the
// call may have stored it, or not): a deadline (the caller's own is
// checked apart), a broken connection or a proxy's UNAVAILABLE, a
// cancelled or aborted call. An INTERNAL answer or one about the request
// itself (INVALID_ARGUMENT and the like) would only come again.
func unknownRetried(err error) bool {
	switch status.Code(err) {
	case codes.DeadlineExceeded, codes.Unavailable, codes.Canceled, codes.Aborted:
		return true
	}
	return false
}

// dedupCovers: the member at addr said (at its last probe) that it
// remembers keyed puts for at least twice elapsed, so a put begun elapsed
// ago, if stored, is recognised there (or, after a failover, by the
// leader it hands over to, which reads the same log).
func (t *LeaderTracker) dedupCovers(addr string, elapsed time.Duration) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.windows[addr] > 2*elapsed
}

// jitter is d +-25 %, so that many clients refused together do not come
// back together.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return d + time.Duration(rand.Int64N(int64(d)/2+1)) - d/4
}

// doubt forgets addr as the leader (another goroutine may have found a
// newer one meanwhile: that one stays).
func (t *LeaderTracker) doubt(addr string) {
	t.mu.Lock()
	if t.leader == addr {
		t.leader = ""
	}
	t.mu.Unlock()
}

// target is the leader's address and connection: the known leader, or
// the result of a lookup (one at a time; hint, with the refusing member's
// term, is asked with the others). A leader last seen in a term before
// minTerm is not taken, also when another call's lookup found it. The
// caller holds a reference to the connection and must release it.
func (t *LeaderTracker) target(ctx context.Context, hint string, minTerm uint64) (string, *grpc.ClientConn, error) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return "", nil, ErrClosed
	}
	if t.leader != "" && t.terms[t.leader] >= minTerm {
		addr, c := t.leader, t.conns[t.leader]
		if c.GetState() == connectivity.Ready {
			t.refs[addr]++
			t.mu.Unlock()
			return addr, c, nil
		}
		// The connection is not up (the leader died or restarts, or the
		// connection broke and went idle): a put would have to connect
		// first and, if that failed, would end as a bare UNAVAILABLE,
		// an unknown outcome. Look the leader up instead: a probe is
		// safe to fail.
		t.leader = ""
	}
	lc := t.lookup
	if lc == nil {
		lc = &lookupCall{done: make(chan struct{}), minTerm: minTerm}
		t.lookup = lc
		if hint != "" {
			t.connLocked(hint) // probed with the others
		}
		t.wg.Add(1)
		go t.runLookup(lc)
	}
	t.mu.Unlock()
	select {
	case <-lc.done:
	case <-ctx.Done():
		return "", nil, ctx.Err()
	}
	if lc.err != nil {
		return "", nil, lc.err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return "", nil, ErrClosed
	}
	c := t.conns[lc.addr]
	if c == nil || t.terms[lc.addr] < minTerm {
		// Evicted since the lookup found it (a learned membership
		// needed the room), or found by another call's lookup in a term
		// this call's refusal has seen end: look again.
		return "", nil, ErrNoLeader
	}
	t.refs[lc.addr]++
	return lc.addr, c, nil
}

// release drops a reference target or probe took.
func (t *LeaderTracker) release(addr string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.refs[addr]--; t.refs[addr] <= 0 {
		delete(t.refs, addr)
	}
}

// connLocked makes sure an address outside members (hinted, or
// learned) has a connection, within MaxHintedAddrs (evicting a stale one
// when at the limit); it returns addr, or "" when it cannot.
// REQUIRES: t.mu.
func (t *LeaderTracker) connLocked(addr string) string {
	if _, ok := t.conns[addr]; ok {
		return addr
	}
	if t.closed || len(addr) > maxAddrLen || (t.hinted >= t.opts.MaxHintedAddrs && !t.evictLocked()) {
		return ""
	}
	c, err := grpc.NewClient(addr, t.opts.DialOptions...)
	if err != nil {
		return ""
	}
	t.conns[addr] = c
	t.hinted++
	return addr
}

// evictLocked closes one connection outside members that nothing uses
// now and that is neither the leader's nor in the newest membership (an
// old hint, a member since removed), the first in address order; false
// when there is none. REQUIRES: t.mu.
func (t *LeaderTracker) evictLocked() bool {
	var stale []string
	for a := range t.conns {
		if !slices.Contains(t.members, a) && !slices.Contains(t.learned, a) && a != t.leader && t.refs[a] == 0 {
			stale = append(stale, a)
		}
	}
	if len(stale) == 0 {
		return false
	}
	a := slices.Min(stale)
	_ = t.conns[a].Close() // unused: nothing in flight to fail
	delete(t.conns, a)
	delete(t.windows, a)
	delete(t.terms, a)
	t.hinted--
	return true
}

// learn takes the client addresses of the members in a member's answer
// (GetReplicaInfo's membership.client_addrs), if its membership is at
// least as new as the newest one seen: a newer one replaces what was
// learned (members removed since drop out, and their connections may be
// evicted), the same one adds the addresses this member knows and the
// last did not (a follower may not know every member's). Each gets a
// connection within MaxHintedAddrs, so the next lookup asks it.
func (t *LeaderTracker) learn(ri *storagedv1.GetReplicaInfoResponse) {
	m := ri.GetMembership()
	if m == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed || m.GetIndex() < t.memIndex {
		return
	}
	var learned []string
	if m.GetIndex() == t.memIndex { // nothing seen yet: memIndex 0, learned empty
		learned = t.learned
	}
	ids := slices.Concat(m.GetVoters(), m.GetLearners())
	for _, id := range ids[:min(len(ids), 2*MaxMembers)] {
		a := m.GetClientAddrs()[id]
		if a != "" && len(a) <= maxAddrLen && !slices.Contains(t.members, a) && !slices.Contains(learned, a) &&
			len(learned) < MaxMembers {
			learned = append(learned, a)
		}
	}
	slices.Sort(learned)
	t.learned, t.memIndex = learned, m.GetIndex()
	for _, a := range learned {
		t.connLocked(a)
	}
}

// refreshLoop asks the leader for the membership every RefreshInterval
// (jittered), until Close.
func (t *LeaderTracker) refreshLoop() {
	defer t.wg.Done()
	timer := time.NewTimer(jitter(t.opts.RefreshInterval))
	defer timer.Stop()
	for {
		select {
		case <-timer.C:
		case <-t.ctx.Done():
			return
		}
		t.refresh()
		timer.Reset(jitter(t.opts.RefreshInterval))
	}
}

// refresh learns the membership from the leader puts go to (none known:
// the next put's lookup learns it), and forgets a leader that says it no
// longer is the ready one, so that the next put looks the leader up
// instead of being refused first.
func (t *LeaderTracker) refresh() {
	addr := t.Leader()
	if addr == "" {
		return
	}
	ri, err := t.probe(t.ctx, addr)
	if err != nil {
		return // a put finds out, or the next round
	}
	t.learn(ri)
	if !isReadyLeader(ri) {
		t.doubt(addr)
	}
}

// runLookup finds the ready leader: the first address that says so
// itself (a member given, or an address hinted or learned before, all
// asked at once), in the term of the refusal that hinted or a later one,
// else a leader address the members name, or a member
// their membership names, that no one was asked about. A member that only names the
// leader is not enough: a dead leader is named until the others time it
// out, and a put sent to it would end with an unknown outcome. (A
// deposed leader that still believes it leads refuses puts without a
// quorum of active followers, or its puts time out: unknown, never acked.)
func (t *LeaderTracker) runLookup(lc *lookupCall) {
	defer t.wg.Done()
	defer func() {
		t.mu.Lock()
		if lc.err == nil && !t.closed {
			t.leader = lc.addr
		}
		t.lookup = nil
		t.mu.Unlock()
		close(lc.done)
	}()
	// Every address at once: the members given, the leader addresses
	// refusals named (a hint's connection is made by target), and the
	// members learned from the membership: a member added to the group
	// since the tracker was made may lead now, and after a hint's probe
	// (it may not have been ready yet) no given member would ever name it
	// again once none leads. Not the hint first and the others after it: a
	// hint may name a member that has just gone, and on Kubernetes a
	// deleted pod's address drops packets rather than refusing them, so
	// its probe would hold the lookup for up to ProbeTimeout. For the same
	// reason a lookup that finds no ready leader among the members it is
	// connected to does not wait for those it is not (probeSome's settle;
	// the caller looks again after LookupInterval): a deleted pod's address
	// held it for the connection attempt's bound, and each rolling restart
	// of a real StatefulSet had 1 s without a write (BENCHMARKS.md "A real
	// run on Kubernetes").
	t.mu.Lock()
	addrs := t.addrsLocked()
	t.mu.Unlock()
	lc.err = ErrNoLeader
	var named []string
	t.probeSome(addrs, true, func(addr string, ri *storagedv1.GetReplicaInfoResponse) bool {
		found := isReadyLeader(ri) && ri.GetTerm() >= lc.minTerm && lc.err != nil
		if found {
			lc.addr, lc.err = addr, nil
		}
		if n := ri.GetLeaderAddr(); n != "" && !slices.Contains(addrs, n) && !slices.Contains(named, n) {
			named = append(named, n)
		}
		return found // the others' answers no longer matter, but for the leaders they name
	})
	if lc.err == nil {
		return
	}
	// A leader no address asked names (a member added to the group since
	// the tracker was made), and the members the answers' membership
	// named that were not asked: each asked itself, within
	// MaxHintedAddrs, since only its own word makes it the ready leader.
	slices.Sort(named)
	t.mu.Lock()
	for _, a := range t.addrsLocked() {
		if !slices.Contains(addrs, a) && !slices.Contains(named, a) {
			named = append(named, a)
		}
	}
	var ask []string
	for _, a := range named {
		if a = t.connLocked(a); a != "" {
			ask = append(ask, a)
		}
	}
	t.mu.Unlock()
	t.probeAll(ask, func(addr string, ri *storagedv1.GetReplicaInfoResponse) bool {
		if isReadyLeader(ri) && ri.GetTerm() >= lc.minTerm && lc.err != nil {
			lc.addr, lc.err = addr, nil
		}
		return lc.err == nil
	})
}

// probeAll asks every address in addrs for its replica info at once, and
// hands each answer (ri nil: none, an error) to each in this goroutine as
// it comes, after learning the membership it reports; once each returns
// true the probes still running are cut short (their answers, mostly nil,
// are still handed over). Every probe has ended when it returns.
func (t *LeaderTracker) probeAll(addrs []string, each func(addr string, ri *storagedv1.GetReplicaInfoResponse) (enough bool)) {
	t.probeSome(addrs, true, each)
}

// probeSome is probeAll; with settle, the probes still running are also
// cut short once every address whose connection was up when they began
// has answered (if one was): an address whose connection is not up yet
// may be one that has gone and drops packets (a deleted pod's), and its
// probe would hold the caller for ProbeTimeout. Its connection goes on
// being made meanwhile, so the next probe of it finds it up if it is.
func (t *LeaderTracker) probeSome(addrs []string, settle bool, each func(addr string, ri *storagedv1.GetReplicaInfoResponse) (enough bool)) {
	ctx, cancel := context.WithCancel(t.ctx)
	defer cancel()
	live := map[string]bool{}
	if settle {
		t.mu.Lock()
		for _, a := range addrs {
			if c := t.conns[a]; c != nil && c.GetState() == connectivity.Ready {
				live[a] = true
			}
		}
		t.mu.Unlock()
	}
	pendingLive := len(live)
	type answer struct {
		addr string
		ri   *storagedv1.GetReplicaInfoResponse
	}
	answers := make(chan answer, len(addrs))
	for _, a := range addrs {
		go func() {
			ri, _ := t.probe(ctx, a) // nil on an error: no answer
			answers <- answer{a, ri}
		}()
	}
	for range addrs {
		a := <-answers
		t.learn(a.ri)
		if each(a.addr, a.ri) {
			cancel()
		}
		if live[a.addr] {
			if pendingLive--; pendingLive == 0 {
				cancel()
			}
		}
	}
}

func isReadyLeader(ri *storagedv1.GetReplicaInfoResponse) bool {
	return ri != nil && ri.GetRole() == storagedv1.ReplicaRole_REPLICA_ROLE_LEADER && ri.GetReady()
}

// probe asks addr for its replica info, within ProbeTimeout. A
// connection in transient failure (the member was down) is woken first:
// its reconnect backoff may have grown while the member restarted, and it
// may be the next leader.
func (t *LeaderTracker) probe(ctx context.Context, addr string) (*storagedv1.GetReplicaInfoResponse, error) {
	t.mu.Lock()
	c := t.conns[addr]
	if t.closed || c == nil { // closed, or an evicted address
		t.mu.Unlock()
		return nil, ErrClosed
	}
	t.refs[addr]++
	t.mu.Unlock()
	defer t.release(addr)
	if c.GetState() == connectivity.TransientFailure {
		c.ResetConnectBackoff()
	}
	ctx, cancel := context.WithTimeout(ctx, t.opts.ProbeTimeout)
	defer cancel()
	ri, err := storagedv1.NewMessageStoreServiceClient(c).GetReplicaInfo(ctx, &storagedv1.GetReplicaInfoRequest{})
	if err == nil {
		t.mu.Lock()
		if t.conns[addr] == c {
			t.windows[addr] = max(ri.GetDedupWindow().AsDuration(), 0)
			t.terms[addr] = ri.GetTerm()
		}
		t.mu.Unlock()
	}
	return ri, err
}
