package main

import (
	"cmp"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/storaged/storaged/server"
	"github.com/storaged/storaged/storage"
	"github.com/storaged/storaged/storage/vfs"
)

// envPrefix is the prefix of every flag's environment twin: --data-dir is
// STORAGED_DATA_DIR.
const envPrefix = "STORAGED_"

// config is the effective configuration of the binary.
//
// Precedence, highest first: a flag on the command line, its STORAGED_*
// environment variable, the default below.
type config struct {
	Listen           string
	MetricsListen    string // "" disables the metrics server
	AdminListen      string // "" disables the admin server
	DataDir          string
	FlushMode        storage.FlushMode
	FileSize         int64
	FlushInterval    time.Duration
	SyncFlushTimeout time.Duration
	Role             storage.Role
	MaxMessageSize   int64
	LogLevel         zerolog.Level
	LogFormat        string // json or console
	TLSCert          string
	TLSKey           string
	TLSClientCA      string
	ShutdownTimeout  time.Duration
	Reflection       bool
	Pprof            bool
	StoreHost        string // "" derives it from the bound gRPC address
	Version          bool
	// MaxConnections bounds the gRPC connections served at once; 0 (the
	// flag's default) is resolved by parseConfig to defaultMaxConnections,
	// negative means no bound.
	MaxConnections int

	// Delayed delivery, retention and disk watermarks (storage.Options).
	FileReservedTime   time.Duration // negative keeps every file
	DeleteWhen         string        // "04", "04;16" or "*"; local time
	DiskCleanPercent   int
	DiskWarningPercent int
	DiskCheckInterval  time.Duration
	DelayLevels        string
	CheckpointInterval time.Duration

	// Topic configuration (storage.Options).
	DefaultQueues     int
	AutoCreateTopics  bool
	MaxTopics         int
	MaxOpenQueueFiles int
	Populate          vfs.PopulateMode
	PopulateAhead     int64
	PopulateNear      int64
	// MaxConsumerOffsets bounds the committed (group, topic, queue) offsets.
	MaxConsumerOffsets int
	// MaxTimerMessages bounds the pending timer messages; TimerMaxDelay
	// how far ahead one may be due.
	MaxTimerMessages int
	TimerMaxDelay    time.Duration
	// Transactional messages: the first check's delay, the time between
	// checks, the checks before a discard, the pending bound.
	TransactionTimeout       time.Duration
	TransactionCheckInterval time.Duration
	TransactionCheckMax      int
	MaxPendingTransactions   int

	// MaxPullInflightBytes bounds the read answers held at once
	// (server.WithMaxPullInflightBytes).
	MaxPullInflightBytes int64
	// MaxPullWait caps a long poll's wait (server.WithMaxPullWait).
	MaxPullWait time.Duration
	// ConsumerMaxAttempts is a RocketMQ consumer group's POP delivery
	// attempts when its client names none (server.WithConsumerMaxAttempts).
	ConsumerMaxAttempts int
	// FifoConsumerGroups are the RocketMQ consumer groups that consume in
	// order (server.WithFifoConsumerGroups), comma separated.
	FifoConsumerGroups string

	// Idempotent puts (storage.Options.DedupWindow, DedupMaxMessages);
	// DedupWindow 0 turns them off.
	DedupWindow      time.Duration
	DedupMaxMessages int

	// Replication group (replication.go); zero when standalone.
	Replication replicationConfig
}

// Defaults. deploy/kubernetes and the Dockerfile rely on the ports and the
// shutdown timeout; README.md lists all of them.
const (
	defaultListen        = ":9090"
	defaultMetricsListen = ":9091"
	// defaultAdminListen is loopback only: the admin service is for the
	// operator on the host (kubectl exec / port-forward), never for a
	// Service or a mesh in front of the data port.
	defaultAdminListen     = "127.0.0.1:9092"
	defaultDataDir         = "./data"
	defaultShutdownTimeout = 30 * time.Second
)

// usageError is a configuration mistake: main exits with status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// parseConfig reads args and the environment (through lookupEnv) into a
// config. Problems are written to stderr and returned as a usageError;
// -h/--help returns flag.ErrHelp after printing the usage.
func parseConfig(args []string, lookupEnv func(string) (string, bool), stderr io.Writer) (config, error) {
	cfg := config{
		Listen:           defaultListen,
		MetricsListen:    defaultMetricsListen,
		AdminListen:      defaultAdminListen,
		DataDir:          defaultDataDir,
		FlushMode:        storage.FlushAsync,
		FileSize:         storage.DefaultFileSize,
		PopulateAhead:    storage.DefaultPopulateAhead,
		PopulateNear:     storage.DefaultPopulateNear,
		FlushInterval:    storage.DefaultFlushInterval,
		SyncFlushTimeout: storage.DefaultSyncFlushTimeout,
		Role:             storage.RoleMaster,
		MaxMessageSize:   storage.DefaultMaxMessageSize,
		LogLevel:         zerolog.InfoLevel,
		LogFormat:        "json",
		ShutdownTimeout:  defaultShutdownTimeout,
		Reflection:       true,

		FileReservedTime:   storage.DefaultFileReservedTime,
		DeleteWhen:         storage.DefaultDeleteWhen,
		DiskCleanPercent:   storage.DefaultDiskCleanPercent,
		DiskWarningPercent: storage.DefaultDiskWarningPercent,
		DiskCheckInterval:  storage.DefaultDiskCheckInterval,
		DelayLevels:        storage.DefaultDelayLevels,
		CheckpointInterval: storage.DefaultCheckpointInterval,

		DefaultQueues:      storage.DefaultQueues,
		AutoCreateTopics:   true,
		MaxTopics:          storage.DefaultMaxTopics,
		MaxConsumerOffsets: storage.DefaultMaxConsumerOffsets,
		MaxTimerMessages:   storage.DefaultMaxTimerMessages,
		TimerMaxDelay:      storage.DefaultTimerMaxDelay,

		TransactionTimeout:       storage.DefaultTransactionTimeout,
		TransactionCheckInterval: storage.DefaultTransactionCheckInterval,
		TransactionCheckMax:      storage.DefaultTransactionCheckMax,
		MaxPendingTransactions:   storage.DefaultMaxPendingTransactions,
		MaxOpenQueueFiles:        storage.DefaultMaxOpenQueueFiles,
		MaxPullInflightBytes:     server.DefaultMaxPullInflightBytes,
		MaxPullWait:              server.DefaultMaxPullWait,
		ConsumerMaxAttempts:      storage.DefaultPopMaxAttempts,
		DedupWindow:              storage.DefaultDedupWindow,
		DedupMaxMessages:         storage.DefaultDedupMaxMessages,
	}
	fs := flag.NewFlagSet("storaged", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&cfg.Listen, "listen", cfg.Listen, "gRPC listen `address` (host:port; port 0 picks a free port)")
	fs.StringVar(&cfg.MetricsListen, "metrics-listen", cfg.MetricsListen, "Prometheus /metrics (and pprof) listen `address`; empty disables it")
	fs.StringVar(&cfg.AdminListen, "admin-listen", cfg.AdminListen,
		"admin service (storaged.v1.AdminService: topics) listen `address`; empty disables it")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "data `directory`; one process per directory")
	fs.Var((*flushModeValue)(&cfg.FlushMode), "flush-mode", "flush `mode`: async (ack from page cache; the default) or sync (ack after msync, group commit)")
	fs.Var((*sizeValue)(&cfg.FileSize), "file-size", "commitlog file `size` in bytes (suffixes KiB, MiB, GiB, K, M, G; KB, MB, GB are decimal)")
	fs.DurationVar(&cfg.FlushInterval, "flush-interval", cfg.FlushInterval, "async flush `period`")
	fs.DurationVar(&cfg.SyncFlushTimeout, "sync-flush-timeout", cfg.SyncFlushTimeout, "sync mode: answer FLUSH_DISK_TIMEOUT after this `duration`")
	fs.Var((*roleValue)(&cfg.Role), "role", "broker `role`: master (the default) or slave (refuses writes)")
	fs.Var((*sizeValue)(&cfg.MaxMessageSize), "max-message-size", "largest message body, and largest batch (sum of bodies), as a `size`")
	fs.Var((*levelValue)(&cfg.LogLevel), "log-level", "log `level`: debug, info, warn, error")
	fs.Var((*formatValue)(&cfg.LogFormat), "log-format", "log `format`: json or console")
	fs.StringVar(&cfg.TLSCert, "tls-cert", "", "TLS certificate `file` (PEM); enables TLS with --tls-key")
	fs.StringVar(&cfg.TLSKey, "tls-key", "", "TLS private key `file` (PEM)")
	fs.StringVar(&cfg.TLSClientCA, "tls-client-ca", "", "CA `file` (PEM) for client certificates; enables mTLS")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", cfg.ShutdownTimeout, "bound on the graceful drain before remaining calls are cut")
	fs.BoolVar(&cfg.Reflection, "reflection", cfg.Reflection, "register gRPC server reflection")
	fs.BoolVar(&cfg.Pprof, "pprof", false, "serve /debug/pprof on the metrics address")
	fs.StringVar(&cfg.StoreHost, "store-host", "",
		"`ip:port`, or an ip alone (the gRPC port then comes from the listener), written into records and msgIds "+
			"(default: the gRPC address, 127.0.0.1 when it listens on all interfaces)")
	fs.BoolVar(&cfg.Version, "version", false, "print the version and exit")
	fs.IntVar(&cfg.MaxConnections, "max-connections", 0,
		"most gRPC `connections` served at once; more wait in the accept backlog until one closes, so the store keeps "+
			"file descriptors for its files. 0: half the file-descriptor limit (RLIMIT_NOFILE); negative: no bound")
	fs.DurationVar(&cfg.FileReservedTime, "file-reserved-time", cfg.FileReservedTime,
		"retention: a commitlog file is deleted once its newest message is older than this `duration`; negative (-1s) keeps every file")
	fs.StringVar(&cfg.DeleteWhen, "delete-when", cfg.DeleteWhen,
		"retention: `hours` of the day, local time, when expired files are deleted: 04, 04;16, or * for every hour")
	fs.IntVar(&cfg.DiskCleanPercent, "disk-clean-percent", cfg.DiskCleanPercent,
		"above this disk use `percent` (df's Use%) expired files are deleted at once, whatever --delete-when says; "+
			"refused writes resume at or below it")
	fs.IntVar(&cfg.DiskWarningPercent, "disk-warning-percent", cfg.DiskWarningPercent,
		"above this disk use `percent` puts are refused (RESOURCE_EXHAUSTED) and health is NOT_SERVING; 100 never refuses")
	fs.DurationVar(&cfg.DiskCheckInterval, "disk-check-interval", cfg.DiskCheckInterval,
		"`period` of the disk usage check and the retention round")
	fs.StringVar(&cfg.DelayLevels, "delay-levels", cfg.DelayLevels,
		"delay level `table`: level n waits the n-th duration (units s, m, h, d, space separated)")
	fs.DurationVar(&cfg.CheckpointInterval, "checkpoint-interval", cfg.CheckpointInterval,
		"`period` of the checkpoint (consume queues flushed, commitlog synced) and of the delay progress save")
	fs.IntVar(&cfg.DefaultQueues, "default-queues", cfg.DefaultQueues,
		fmt.Sprintf("queue `count` of a topic a put creates (1-%d)", storage.MaxQueues))
	fs.BoolVar(&cfg.AutoCreateTopics, "auto-create-topics", cfg.AutoCreateTopics,
		"a put to an unknown topic creates it; false refuses it (NOT_FOUND, TOPIC_NOT_EXIST) until the admin service creates it")
	fs.IntVar(&cfg.MaxTopics, "max-topics", cfg.MaxTopics,
		"most `topics` the store holds; creating more is refused (RESOURCE_EXHAUSTED)")
	fs.IntVar(&cfg.MaxConsumerOffsets, "max-consumer-offsets", cfg.MaxConsumerOffsets,
		"most committed (consumer group, topic, queue) `offsets` the store holds (1-10000000); a commit of one more is refused (RESOURCE_EXHAUSTED)")
	fs.IntVar(&cfg.MaxTimerMessages, "max-timer-messages", cfg.MaxTimerMessages,
		"most timer messages (delivery at a time) waiting at once (1-67108864); a timer put beyond it is refused (RESOURCE_EXHAUSTED, WHEEL_TIMER_FLOW_CONTROL)")
	fs.DurationVar(&cfg.TimerMaxDelay, "timer-max-delay", cfg.TimerMaxDelay,
		"how far ahead a timer message may be due (RocketMQ timerMaxDelaySec; 1s-8784h); later is refused (INVALID_ARGUMENT, WHEEL_TIMER_MSG_ILLEGAL)")
	fs.DurationVar(&cfg.TransactionTimeout, "transaction-timeout", cfg.TransactionTimeout,
		"how old a transactional half message must be before the store asks its producer to resolve it (RocketMQ transactionTimeOut; 1s-24h; "+
			"a message's CHECK_IMMUNITY_TIME_IN_SECONDS overrides it)")
	fs.DurationVar(&cfg.TransactionCheckInterval, "transaction-check-interval", cfg.TransactionCheckInterval,
		"time between two checks of one unresolved half message (RocketMQ transactionCheckInterval; 1s-24h)")
	fs.IntVar(&cfg.TransactionCheckMax, "transaction-check-max", cfg.TransactionCheckMax,
		"checks of an unresolved half message before it is discarded as rolled back (RocketMQ transactionCheckMax; 1-1000)")
	fs.IntVar(&cfg.MaxPendingTransactions, "max-pending-transactions", cfg.MaxPendingTransactions,
		"most transactional half messages pending at once (1-10000000); a half send beyond it is refused (RESOURCE_EXHAUSTED, TOO_MANY_REQUESTS)")
	fs.Var((*populateValue)(&cfg.Populate), "populate",
		"how a new commitlog file is faulted in ahead of the writer: `mode` write (the default: MADV_POPULATE_WRITE for the --populate-near bytes just ahead, no fault on the put path; the rest as read), "+
			"read (MADV_POPULATE_READ: clean pages, a write fault per page on the put path), willneed, off, "+
			"or zero (write, with the --populate-near zeros written to the disk first: faster syncs at a few writers, every byte written twice); BENCHMARKS.md measures them")
	fs.Var((*sizeValue)(&cfg.PopulateAhead), "populate-ahead",
		"how far ahead of the writer a commitlog file is kept populated (`size`; suffixes as --file-size); "+
			"--file-size or more populates whole files as soon as they exist")
	fs.Var((*sizeValue)(&cfg.PopulateNear), "populate-near",
		"with --populate write (or zero), how much of that window, just ahead of the writer, is made writable (`size`: dirty zeros, no page fault on the put path); "+
			"the rest is populated read (clean pages). --populate-ahead or more makes the whole window writable, whose zeros the kernel then writes back in one burst every 30 s")
	fs.IntVar(&cfg.MaxOpenQueueFiles, "max-open-queue-files", cfg.MaxOpenQueueFiles,
		"`count` of consume-queue files kept open at once; the least recently used idle one is closed beyond it")
	fs.Var((*sizeValue)(&cfg.MaxPullInflightBytes), "max-pull-inflight-bytes",
		"bound on the read answers (pulls count their max_bytes) held at once, as a `size`; reads beyond it get RESOURCE_EXHAUSTED with a retry delay")
	fs.DurationVar(&cfg.MaxPullWait, "max-pull-wait", cfg.MaxPullWait,
		"longest `duration` a long poll (PullMessages wait) waits; keep it under the request timeout of any proxy in front (Envoy's default: 15s)")
	fs.IntVar(&cfg.ConsumerMaxAttempts, "consumer-max-attempts", cfg.ConsumerMaxAttempts,
		"delivery `attempts` of a RocketMQ consumer group (POP: SimpleConsumer, PushConsumer) whose client names none; "+
			"a message received that many times without an ack goes to %DLQ%<group> (1-1000)")
	fs.StringVar(&cfg.FifoConsumerGroups, "fifo-consumer-groups", cfg.FifoConsumerGroups,
		"comma-separated RocketMQ consumer `groups` that consume in order (RocketMQ's consumeMessageOrderly): a queue is not "+
			"received from while the group has one of its messages in flight, and an unacked message is delivered again in place")
	fs.DurationVar(&cfg.DedupWindow, "dedup-window", cfg.DedupWindow,
		"how long a put carrying a UNIQ_KEY property is remembered: a retry of the key on the same topic within this `duration` "+
			"gets the first put's answer and stores nothing; 0 turns deduplication off")
	fs.IntVar(&cfg.DedupMaxMessages, "dedup-max-messages", cfg.DedupMaxMessages,
		"most `messages` the dedup window remembers (about 205 bytes each); past it the oldest keys are forgotten first")
	cfg.Replication.register(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: storaged [flags]\n\n"+
			"Every flag has an environment twin: --data-dir is %sDATA_DIR.\n"+
			"A flag on the command line wins over the environment, which wins over the default.\n\n", envPrefix)
		fs.PrintDefaults()
	}

	fail := func(err error) (config, error) {
		fmt.Fprintf(stderr, "storaged: %v\n", err)
		return config{}, usageError{err}
	}
	// The environment first, so that the command line overrides it.
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		name := envName(f.Name)
		v, ok := lookupEnv(name)
		if !ok || envErr != nil {
			return
		}
		if err := fs.Set(f.Name, v); err != nil {
			envErr = fmt.Errorf("%s=%q: %w", name, v, err)
		}
	})
	if envErr != nil {
		return fail(envErr)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return config{}, err
		}
		return config{}, usageError{err} // flag already printed it with the usage
	}
	if fs.NArg() > 0 {
		return fail(fmt.Errorf("unexpected arguments %q (storaged takes flags only)", fs.Args()))
	}
	cfg.Replication.noteSet(fs)
	cfg.Replication.applyOrdinalIDs()
	if cfg.Replication.group() && !cfg.Replication.flushModeSet {
		cfg.FlushMode = storage.FlushSync // a group acknowledges only fsynced messages
	}
	if err := cfg.validate(); err != nil {
		return fail(err)
	}
	if cfg.MaxConnections == 0 {
		cfg.MaxConnections = defaultMaxConnections()
	}
	return cfg, nil
}

// defaultMaxConnections is half the process's file-descriptor limit
// (RLIMIT_NOFILE, soft; the Go runtime raises it to the hard limit at
// start), at least minMaxConnections: every connection costs a
// descriptor, and the other half stays for the store's files (commitlog
// and consume-queue files, checkpoint and config writes), the listeners
// and the metrics server. With `ulimit -n 256`, 241 idle connections made
// the checkpoint write fail with EMFILE; bounded at 128, they wait.
func defaultMaxConnections() int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur == unix.RLIM_INFINITY {
		return maxMaxConnections
	}
	return int(min(max(rl.Cur/2, minMaxConnections), maxMaxConnections))
}

// Bounds of the derived --max-connections.
const (
	minMaxConnections = 16
	maxMaxConnections = 1 << 20
)

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// validate checks what storage.Options.Validate does not.
func (c *config) validate() error {
	var errs []error
	if c.Listen == "" {
		errs = append(errs, errors.New("--listen must not be empty"))
	}
	if c.DataDir == "" {
		errs = append(errs, errors.New("--data-dir must not be empty"))
	}
	if c.FlushInterval <= 0 || c.SyncFlushTimeout <= 0 || c.ShutdownTimeout <= 0 || c.DiskCheckInterval <= 0 || c.CheckpointInterval <= 0 {
		errs = append(errs, errors.New("--flush-interval, --sync-flush-timeout, --shutdown-timeout, --disk-check-interval and "+
			"--checkpoint-interval must be positive"))
	}
	// storage.Options reads a zero or empty value as "the default": refuse
	// them here rather than run with something the operator did not ask for.
	if c.FileReservedTime == 0 {
		errs = append(errs, errors.New("--file-reserved-time must not be 0 (a negative value such as -1s keeps every file)"))
	}
	if strings.TrimSpace(c.DeleteWhen) == "" {
		errs = append(errs, errors.New(`--delete-when must not be empty (hours such as 04 or 04;16, or "*" for every hour)`))
	}
	if strings.TrimSpace(c.DelayLevels) == "" {
		errs = append(errs, errors.New("--delay-levels must not be empty"))
	}
	switch {
	case c.DiskWarningPercent < 1 || c.DiskWarningPercent > 100 || c.DiskCleanPercent < 1 || c.DiskCleanPercent > 100:
		errs = append(errs, fmt.Errorf("--disk-clean-percent (%d) and --disk-warning-percent (%d) must be between 1 and 100",
			c.DiskCleanPercent, c.DiskWarningPercent))
	case c.DiskCleanPercent > c.DiskWarningPercent:
		errs = append(errs, fmt.Errorf("--disk-clean-percent (%d) must not be above --disk-warning-percent (%d)",
			c.DiskCleanPercent, c.DiskWarningPercent))
	}
	if c.DefaultQueues < 1 || c.DefaultQueues > storage.MaxQueues {
		errs = append(errs, fmt.Errorf("--default-queues %d out of range [1, %d]", c.DefaultQueues, storage.MaxQueues))
	}
	if c.MaxTopics < 1 {
		errs = append(errs, fmt.Errorf("--max-topics %d must be positive", c.MaxTopics))
	}
	if c.MaxConsumerOffsets < 1 || c.MaxConsumerOffsets > 10000000 {
		errs = append(errs, fmt.Errorf("--max-consumer-offsets %d out of range [1, 10000000]", c.MaxConsumerOffsets))
	}
	if c.MaxTimerMessages < 1 || c.MaxTimerMessages > 1<<26 {
		errs = append(errs, fmt.Errorf("--max-timer-messages %d out of range [1, %d]", c.MaxTimerMessages, 1<<26))
	}
	if c.TimerMaxDelay < time.Second || c.TimerMaxDelay > 366*24*time.Hour {
		errs = append(errs, fmt.Errorf("--timer-max-delay %v out of range [1s, 8784h]", c.TimerMaxDelay))
	}
	if c.TransactionTimeout < time.Second || c.TransactionTimeout > 24*time.Hour {
		errs = append(errs, fmt.Errorf("--transaction-timeout %v out of range [1s, 24h]", c.TransactionTimeout))
	}
	if c.TransactionCheckInterval < time.Second || c.TransactionCheckInterval > 24*time.Hour {
		errs = append(errs, fmt.Errorf("--transaction-check-interval %v out of range [1s, 24h]", c.TransactionCheckInterval))
	}
	if c.TransactionCheckMax < 1 || c.TransactionCheckMax > 1000 {
		errs = append(errs, fmt.Errorf("--transaction-check-max %d out of range [1, 1000]", c.TransactionCheckMax))
	}
	if c.MaxPendingTransactions < 1 || c.MaxPendingTransactions > 10000000 {
		errs = append(errs, fmt.Errorf("--max-pending-transactions %d out of range [1, 10000000]", c.MaxPendingTransactions))
	}
	if c.AdminListen != "" && c.AdminListen == c.Listen && !strings.HasSuffix(c.Listen, ":0") {
		errs = append(errs, errors.New("--admin-listen must differ from --listen"))
	}
	if c.MaxOpenQueueFiles < 1 {
		errs = append(errs, fmt.Errorf("--max-open-queue-files %d must be at least 1", c.MaxOpenQueueFiles))
	}
	if c.DedupWindow < 0 {
		errs = append(errs, fmt.Errorf("--dedup-window %v must not be negative (0 turns deduplication off)", c.DedupWindow))
	}
	if c.DedupMaxMessages < 1 {
		errs = append(errs, fmt.Errorf("--dedup-max-messages %d must be positive", c.DedupMaxMessages))
	}
	if c.MaxPullWait <= 0 {
		errs = append(errs, fmt.Errorf("--max-pull-wait %v must be positive", c.MaxPullWait))
	}
	for _, g := range c.fifoGroups() {
		if p := storage.GroupProblem(g); p != "" {
			errs = append(errs, fmt.Errorf("--fifo-consumer-groups: %s", p))
		}
	}
	if n := len(c.fifoGroups()); n > maxFifoGroups {
		errs = append(errs, fmt.Errorf("--fifo-consumer-groups names %d groups, limit %d", n, maxFifoGroups))
	}
	if c.ConsumerMaxAttempts < 1 || c.ConsumerMaxAttempts > storage.MaxPopAttempts {
		errs = append(errs, fmt.Errorf("--consumer-max-attempts %d out of range [1, %d]", c.ConsumerMaxAttempts, storage.MaxPopAttempts))
	}
	if c.MaxPullInflightBytes <= 0 {
		errs = append(errs, fmt.Errorf("--max-pull-inflight-bytes %d must be positive", c.MaxPullInflightBytes))
	}
	if c.MaxMessageSize <= 0 || c.MaxMessageSize > math.MaxInt32-(1<<20) {
		errs = append(errs, fmt.Errorf("--max-message-size %d out of range", c.MaxMessageSize))
	}
	if (c.TLSCert == "") != (c.TLSKey == "") {
		errs = append(errs, errors.New("--tls-cert and --tls-key go together"))
	}
	if c.TLSClientCA != "" && c.TLSCert == "" {
		errs = append(errs, errors.New("--tls-client-ca needs --tls-cert and --tls-key"))
	}
	if c.StoreHost != "" {
		if _, err := netip.ParseAddrPort(c.StoreHost); err != nil {
			if _, aerr := netip.ParseAddr(c.StoreHost); aerr != nil {
				errs = append(errs, fmt.Errorf("--store-host must be ip:port or ip: %w", err))
			}
		}
	}
	errs = append(errs, c.Replication.validate(c.FlushMode)...)
	if len(errs) == 0 {
		// Fail fast on what the store would refuse at Open (file size range,
		// message size above the file size, …). The store host is only known
		// once the listener is bound; the default stands in for it.
		if err := c.storageOptions(storage.DefaultStoreHost, nil).Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// storeHost is the address written into records and msgIds: --store-host,
// or the bound gRPC address with 127.0.0.1 for an unspecified host
// (":9090", "0.0.0.0:9090", "[::]:9090"). A --store-host without a port
// takes the bound port: Kubernetes sets it from the pod IP
// (STORAGED_STORE_HOST=$(POD_IP)), which "$(POD_IP):9090" would get wrong
// for an IPv6 pod (no brackets).
func (c *config) storeHost(bound net.Addr) (netip.AddrPort, error) {
	if c.StoreHost != "" {
		ap, err := netip.ParseAddrPort(c.StoreHost)
		if err == nil {
			return ap, nil
		}
		ip, aerr := netip.ParseAddr(c.StoreHost)
		if aerr != nil {
			return netip.AddrPort{}, err
		}
		tcp, ok := bound.(*net.TCPAddr)
		if !ok {
			return netip.AddrPort{}, fmt.Errorf("gRPC listener address %v is not TCP", bound)
		}
		return netip.AddrPortFrom(ip.Unmap(), tcp.AddrPort().Port()), nil
	}
	tcp, ok := bound.(*net.TCPAddr)
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("gRPC listener address %v is not TCP", bound)
	}
	ap := tcp.AddrPort()
	ip := ap.Addr().Unmap()
	if ip.IsUnspecified() || !ip.IsValid() {
		ip = netip.AddrFrom4([4]byte{127, 0, 0, 1})
	}
	return netip.AddrPortFrom(ip, ap.Port()), nil
}

// storageOptions turns the configuration into storage.Options.
func (c *config) storageOptions(host netip.AddrPort, logger *zerolog.Logger) storage.Options {
	return storage.Options{
		Dir:              c.DataDir,
		FileSize:         c.FileSize,
		MaxMessageSize:   int(c.MaxMessageSize),
		FlushMode:        c.FlushMode,
		FlushInterval:    c.FlushInterval,
		SyncFlushTimeout: c.SyncFlushTimeout,
		Role:             c.Role,
		StoreHost:        host,
		Logger:           logger,

		FileReservedTime:   c.FileReservedTime,
		DeleteWhen:         c.DeleteWhen,
		DiskCleanPercent:   c.DiskCleanPercent,
		DiskWarningPercent: c.DiskWarningPercent,
		DiskCheckInterval:  c.DiskCheckInterval,
		DelayLevels:        c.DelayLevels,
		CheckpointInterval: c.CheckpointInterval,

		DefaultQueues:      c.DefaultQueues,
		NoAutoCreateTopics: !c.AutoCreateTopics,
		MaxTopics:          c.MaxTopics,
		MaxConsumerOffsets: c.MaxConsumerOffsets,
		MaxOpenQueueFiles:  c.MaxOpenQueueFiles,
		MaxTimerMessages:   c.MaxTimerMessages,
		TimerMaxDelay:      c.TimerMaxDelay,
		Populate:           c.Populate,
		PopulateAhead:      c.PopulateAhead,
		PopulateNear:       c.PopulateNear,

		TransactionTimeout:       c.TransactionTimeout,
		TransactionCheckInterval: c.TransactionCheckInterval,
		TransactionCheckMax:      c.TransactionCheckMax,
		MaxPendingTransactions:   c.MaxPendingTransactions,

		DedupWindow:      cmp.Or(c.DedupWindow, -1), // 0: off
		DedupMaxMessages: c.DedupMaxMessages,
	}
}

// log writes the effective configuration as one log line.
func (c *config) log(l zerolog.Logger) {
	l.Info().
		Str("listen", c.Listen).
		Str("metrics_listen", c.MetricsListen).
		Str("admin_listen", c.AdminListen).
		Str("data_dir", c.DataDir).
		Str("flush_mode", c.FlushMode.String()).
		Str("file_size", formatSize(c.FileSize)).
		Stringer("flush_interval", c.FlushInterval).
		Stringer("sync_flush_timeout", c.SyncFlushTimeout).
		Str("role", c.Role.String()).
		Str("max_message_size", formatSize(c.MaxMessageSize)).
		Str("log_level", c.LogLevel.String()).
		Str("log_format", c.LogFormat).
		Bool("tls", c.TLSCert != "").
		Bool("mtls", c.TLSClientCA != "").
		Stringer("shutdown_timeout", c.ShutdownTimeout).
		Bool("reflection", c.Reflection).
		Bool("pprof", c.Pprof).
		Str("store_host", cmp.Or(c.StoreHost, "auto")).
		Int("max_connections", c.MaxConnections).
		Stringer("file_reserved_time", c.FileReservedTime).
		Str("delete_when", c.DeleteWhen).
		Int("disk_clean_percent", c.DiskCleanPercent).
		Int("disk_warning_percent", c.DiskWarningPercent).
		Stringer("disk_check_interval", c.DiskCheckInterval).
		Str("delay_levels", c.DelayLevels).
		Stringer("checkpoint_interval", c.CheckpointInterval).
		Int("default_queues", c.DefaultQueues).
		Bool("auto_create_topics", c.AutoCreateTopics).
		Int("max_topics", c.MaxTopics).
		Int("max_consumer_offsets", c.MaxConsumerOffsets).
		Int("max_timer_messages", c.MaxTimerMessages).
		Stringer("timer_max_delay", c.TimerMaxDelay).
		Stringer("transaction_timeout", c.TransactionTimeout).
		Stringer("transaction_check_interval", c.TransactionCheckInterval).
		Int("transaction_check_max", c.TransactionCheckMax).
		Int("max_pending_transactions", c.MaxPendingTransactions).
		Int("max_open_queue_files", c.MaxOpenQueueFiles).
		Str("populate", c.Populate.String()).
		Str("populate_ahead", formatSize(c.PopulateAhead)).
		Str("populate_near", formatSize(c.PopulateNear)).
		Str("max_pull_inflight_bytes", formatSize(c.MaxPullInflightBytes)).
		Stringer("max_pull_wait", c.MaxPullWait).
		Int("consumer_max_attempts", c.ConsumerMaxAttempts).
		Str("fifo_consumer_groups", c.FifoConsumerGroups).
		Stringer("dedup_window", c.DedupWindow).
		Int("dedup_max_messages", c.DedupMaxMessages).
		Uint64("raft_id", c.Replication.RaftID).
		Stringer("raft_peers", &c.Replication.RaftPeers).
		Str("raft_join", c.Replication.join()).
		Stringer("raft_ordinal_ids", &c.Replication.OrdinalIDs).
		Bool("raft_learner", c.Replication.RaftLearner).Stringer("raft_learners", &c.Replication.RaftLearners).
		Stringer("replication_timeout", c.Replication.ReplicationTimeout).
		Stringer("raft_catchup_window", &c.Replication.CatchUpWindow).
		Stringer("raft_catchup_readahead", &c.Replication.CatchUpReadahead).
		Bool("peer_tls", c.Replication.PeerTLSCert != "").
		Bool("raft_forward_puts", c.Replication.ForwardPuts).
		Bool("raft_follower_reads", c.Replication.FollowerReads).
		Msg("effective configuration")
}

// sizeValue is a byte count flag: "1073741824", "1GiB", "64MiB", "64M"
// (binary), "100MB" (decimal).
type sizeValue int64

func (v *sizeValue) String() string { return formatSize(int64(*v)) }

func (v *sizeValue) Set(s string) error {
	n, err := parseSize(s)
	if err != nil {
		return err
	}
	*v = sizeValue(n)
	return nil
}

var sizeUnits = map[string]int64{
	"": 1, "b": 1,
	"k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}

func parseSize(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && t[i] >= '0' && t[i] <= '9' {
		i++
	}
	if i == 0 {
		return 0, fmt.Errorf("size %q: want a number with an optional unit (KiB, MiB, GiB, TiB; KB, MB, GB, TB)", s)
	}
	n, err := strconv.ParseInt(t[:i], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("size %q: %w", s, err)
	}
	unit, ok := sizeUnits[strings.ToLower(strings.TrimSpace(t[i:]))]
	if !ok {
		return 0, fmt.Errorf("size %q: unknown unit %q (want KiB, MiB, GiB, TiB; KB, MB, GB, TB)", s, t[i:])
	}
	if n > math.MaxInt64/unit {
		return 0, fmt.Errorf("size %q overflows", s)
	}
	return n * unit, nil
}

// formatSize prints n with the largest binary unit that divides it.
func formatSize(n int64) string {
	for _, u := range []struct {
		name string
		size int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.size == 0 {
			return strconv.FormatInt(n/u.size, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

type flushModeValue storage.FlushMode

func (v *flushModeValue) String() string { return storage.FlushMode(*v).String() }

func (v *flushModeValue) Set(s string) error {
	m, err := storage.ParseFlushMode(s)
	if err != nil {
		return err
	}
	*v = flushModeValue(m)
	return nil
}

type populateValue vfs.PopulateMode

func (v *populateValue) String() string { return vfs.PopulateMode(*v).String() }

func (v *populateValue) Set(s string) error {
	m, err := vfs.ParsePopulateMode(s)
	if err != nil {
		return err
	}
	*v = populateValue(m)
	return nil
}

type roleValue storage.Role

func (v *roleValue) String() string { return storage.Role(*v).String() }

func (v *roleValue) Set(s string) error {
	r, err := storage.ParseRole(s)
	if err != nil {
		return err
	}
	*v = roleValue(r)
	return nil
}

type levelValue zerolog.Level

func (v *levelValue) String() string { return zerolog.Level(*v).String() }

func (v *levelValue) Set(s string) error {
	switch l, err := zerolog.ParseLevel(strings.ToLower(s)); {
	case err != nil:
		return err
	case s == "" || l == zerolog.NoLevel:
		return fmt.Errorf("log level %q: want debug, info, warn or error", s)
	default:
		*v = levelValue(l)
		return nil
	}
}

type formatValue string

func (v *formatValue) String() string { return string(*v) }

func (v *formatValue) Set(s string) error {
	switch s {
	case "json", "console":
		*v = formatValue(s)
		return nil
	}
	return fmt.Errorf("log format %q: want json or console", s)
}

// maxFifoGroups bounds --fifo-consumer-groups.
const maxFifoGroups = 10000

// fifoGroups is --fifo-consumer-groups split at commas (empty names
// dropped).
func (c *config) fifoGroups() []string {
	var out []string
	for _, g := range strings.Split(c.FifoConsumerGroups, ",") {
		if g = strings.TrimSpace(g); g != "" {
			out = append(out, g)
		}
	}
	return out
}
