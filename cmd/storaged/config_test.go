package main

import (
	"bytes"
	"errors"
	"flag"
	"net"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/sys/unix"

	"github.com/storaged/storaged/storage"
	"github.com/storaged/storaged/storage/vfs"
)

func env(kv ...string) func(string) (string, bool) {
	m := map[string]string{}
	for i := 0; i+1 < len(kv); i += 2 {
		m[kv[i]] = kv[i+1]
	}
	return func(k string) (string, bool) {
		v, ok := m[k]
		return v, ok
	}
}

func TestConfigDefaults(t *testing.T) {
	cfg, err := parseConfig(nil, env(), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	want := config{
		Listen: ":9090", MetricsListen: ":9091", AdminListen: "127.0.0.1:9092", DataDir: "./data", FlushMode: storage.FlushAsync,
		FileSize: 1 << 30, FlushInterval: 500 * time.Millisecond, SyncFlushTimeout: 5 * time.Second,
		Role: storage.RoleMaster, MaxMessageSize: 4 << 20, LogLevel: zerolog.InfoLevel, LogFormat: "json",
		ShutdownTimeout: 30 * time.Second, Reflection: true,
		FileReservedTime: 72 * time.Hour, DeleteWhen: "04", DiskCleanPercent: 85, DiskWarningPercent: 90,
		DiskCheckInterval: time.Second, DelayLevels: "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h",
		CheckpointInterval: time.Second, MaxConnections: defaultMaxConnections(),
		DefaultQueues: 8, AutoCreateTopics: true, MaxTopics: 10000, MaxConsumerOffsets: 100000, MaxTimerMessages: 1 << 20, TimerMaxDelay: 72 * time.Hour,
		MaxOpenQueueFiles:  256,
		TransactionTimeout: 6 * time.Second, TransactionCheckInterval: 30 * time.Second, TransactionCheckMax: 15,
		MaxPendingTransactions: 100000,
		MaxPullInflightBytes:   256 << 20,
		MaxPullWait:            10 * time.Second,
		ConsumerMaxAttempts:    17,
		DedupWindow:            10 * time.Minute,
		DedupMaxMessages:       1 << 18,
		PopulateAhead:          128 << 20,
		PopulateNear:           16 << 20,
		Replication: replicationConfig{ReplicationTimeout: 5 * time.Second, CatchUpWindow: sizeValue(storage.DefaultCatchUpWindow),
			RaftTick: 100 * time.Millisecond, ElectionTimeout: time.Second, GroupName: "default"},
	}
	if !reflect.DeepEqual(cfg, want) {
		t.Errorf("defaults\n got %+v\nwant %+v", cfg, want)
	}
	// The defaults must make valid storage options.
	opts := cfg.storageOptions(netip.MustParseAddrPort("127.0.0.1:9090"), nil)
	if err := opts.Validate(); err != nil {
		t.Errorf("default storage options: %v", err)
	}
}

// TestConfigTopics: the topic flags and their environment twins reach
// storage.Options.
func TestConfigTopics(t *testing.T) {
	e := env("STORAGED_DEFAULT_QUEUES", "16", "STORAGED_AUTO_CREATE_TOPICS", "false", "STORAGED_MAX_TOPICS", "50",
		"STORAGED_ADMIN_LISTEN", "")
	cfg, err := parseConfig([]string{"--max-topics", "60"}, e, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	o := cfg.storageOptions(netip.MustParseAddrPort("127.0.0.1:9090"), nil)
	if o.DefaultQueues != 16 || !o.NoAutoCreateTopics || o.MaxTopics != 60 || cfg.AdminListen != "" {
		t.Fatalf("config %+v → options default queues %d, no auto-create %v, max topics %d", cfg, o.DefaultQueues, o.NoAutoCreateTopics, o.MaxTopics)
	}
	var log bytes.Buffer
	cfg.log(zerolog.New(&log))
	for _, f := range []string{`"default_queues":16`, `"auto_create_topics":false`, `"max_topics":60`, `"admin_listen":""`} {
		if !strings.Contains(log.String(), f) {
			t.Errorf("effective configuration line lacks %s: %s", f, log.String())
		}
	}
}

func TestConfigPrecedence(t *testing.T) {
	e := env("STORAGED_LISTEN", "127.0.0.1:7000", "STORAGED_DATA_DIR", "/env/data", "STORAGED_FLUSH_MODE", "sync",
		"STORAGED_FILE_SIZE", "64MiB", "STORAGED_REFLECTION", "false", "STORAGED_SHUTDOWN_TIMEOUT", "9s",
		"STORAGED_LOG_LEVEL", "debug", "STORAGED_ROLE", "slave", "STORAGED_METRICS_LISTEN", "",
		"STORAGED_MAX_PULL_INFLIGHT_BYTES", "64MiB", "STORAGED_MAX_PULL_WAIT", "20s", "STORAGED_DEDUP_WINDOW", "2m",
		"STORAGED_DEDUP_MAX_MESSAGES", "1000", "STORAGED_POPULATE", "read", "STORAGED_POPULATE_AHEAD", "16MiB", "STORAGED_POPULATE_NEAR", "2MiB")
	cfg, err := parseConfig([]string{"--data-dir", "/flag/data", "--file-size=128MiB", "-reflection=true", "--max-pull-wait", "14s"}, e, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"listen (env)", cfg.Listen, "127.0.0.1:7000"},
		{"metrics-listen (empty env disables)", cfg.MetricsListen, ""},
		{"data-dir (flag over env)", cfg.DataDir, "/flag/data"},
		{"flush-mode (env)", cfg.FlushMode, storage.FlushSync},
		{"file-size (flag over env)", cfg.FileSize, int64(128 << 20)},
		{"reflection (flag over env)", cfg.Reflection, true},
		{"shutdown-timeout (env)", cfg.ShutdownTimeout, 9 * time.Second},
		{"log-level (env)", cfg.LogLevel, zerolog.DebugLevel},
		{"role (env)", cfg.Role, storage.RoleSlave},
		{"max-pull-inflight-bytes (env)", cfg.MaxPullInflightBytes, int64(64 << 20)},
		{"max-pull-wait (flag over env)", cfg.MaxPullWait, 14 * time.Second},
		{"dedup-window (env)", cfg.storageOptions(netip.MustParseAddrPort("127.0.0.1:1"), nil).DedupWindow, 2 * time.Minute},
		{"dedup-max-messages (env)", cfg.storageOptions(netip.MustParseAddrPort("127.0.0.1:1"), nil).DedupMaxMessages, 1000},
		{"populate (env)", cfg.storageOptions(netip.MustParseAddrPort("127.0.0.1:1"), nil).Populate, vfs.PopulateRead},
		{"populate-ahead (env)", cfg.storageOptions(netip.MustParseAddrPort("127.0.0.1:1"), nil).PopulateAhead, int64(16 << 20)},
		{"populate-near (env)", cfg.storageOptions(netip.MustParseAddrPort("127.0.0.1:1"), nil).PopulateNear, int64(2 << 20)},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

// TestConfigRetentionAndDelay: the delayed-delivery, retention and disk
// flags, from the environment and the command line (which wins), reach
// storage.Options unchanged.
func TestConfigRetentionAndDelay(t *testing.T) {
	e := env("STORAGED_FILE_RESERVED_TIME", "48h", "STORAGED_DELETE_WHEN", "04;16", "STORAGED_DISK_CLEAN_PERCENT", "70",
		"STORAGED_DISK_WARNING_PERCENT", "80", "STORAGED_DISK_CHECK_INTERVAL", "5s", "STORAGED_DELAY_LEVELS", "1s 2s",
		"STORAGED_CHECKPOINT_INTERVAL", "3s")
	cfg, err := parseConfig([]string{"--file-reserved-time=-1s", "--delete-when", "*", "--disk-warning-percent", "95",
		"--delay-levels", "1s 5s 1h 1d"}, e, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	o := cfg.storageOptions(netip.MustParseAddrPort("127.0.0.1:9090"), nil)
	checks := []struct {
		name      string
		got, want any
	}{
		{"file-reserved-time (flag over env; negative keeps everything)", o.FileReservedTime, -time.Second},
		{"delete-when (flag over env)", o.DeleteWhen, "*"},
		{"disk-clean-percent (env)", o.DiskCleanPercent, 70},
		{"disk-warning-percent (flag over env)", o.DiskWarningPercent, 95},
		{"disk-check-interval (env)", o.DiskCheckInterval, 5 * time.Second},
		{"delay-levels (flag over env)", o.DelayLevels, "1s 5s 1h 1d"},
		{"checkpoint-interval (env)", o.CheckpointInterval, 3 * time.Second},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
	if err := o.Validate(); err != nil {
		t.Errorf("storage options: %v", err)
	}
	// The defaults map to the storage defaults, spelled out (no zero value
	// left for the store to interpret).
	cfg, err = parseConfig(nil, env(), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	o = cfg.storageOptions(netip.MustParseAddrPort("127.0.0.1:9090"), nil)
	if o.FileReservedTime != storage.DefaultFileReservedTime || o.DeleteWhen != storage.DefaultDeleteWhen ||
		o.DiskCleanPercent != storage.DefaultDiskCleanPercent || o.DiskWarningPercent != storage.DefaultDiskWarningPercent ||
		o.DiskCheckInterval != storage.DefaultDiskCheckInterval || o.DelayLevels != storage.DefaultDelayLevels ||
		o.CheckpointInterval != storage.DefaultCheckpointInterval {
		t.Errorf("default storage options %+v", o)
	}
	// -h documents every one of them.
	var stderr bytes.Buffer
	if _, err := parseConfig([]string{"-h"}, env(), &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("-h: %v", err)
	}
	for _, f := range []string{"-file-reserved-time", "-delete-when", "-disk-clean-percent", "-disk-warning-percent",
		"-disk-check-interval", "-delay-levels", "-checkpoint-interval", storage.DefaultDelayLevels} {
		if !strings.Contains(stderr.String(), f) {
			t.Errorf("usage does not mention %q", f)
		}
	}
}

// TestConfigMaxOpenQueueFiles: --max-open-queue-files and its environment
// twin reach storage.Options; the flag wins; zero is refused.
func TestConfigMaxOpenQueueFiles(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		env     []string
		want    int
		wantErr string
	}{
		{"default", nil, nil, storage.DefaultMaxOpenQueueFiles, ""},
		{"env", nil, []string{"STORAGED_MAX_OPEN_QUEUE_FILES", "64"}, 64, ""},
		{"flag over env", []string{"--max-open-queue-files", "8"}, []string{"STORAGED_MAX_OPEN_QUEUE_FILES", "64"}, 8, ""},
		{"zero", []string{"--max-open-queue-files", "0"}, nil, 0, "--max-open-queue-files 0 must be at least 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			cfg, err := parseConfig(tc.args, env(tc.env...), &stderr)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(stderr.String(), tc.wantErr) {
					t.Fatalf("err %v, stderr %q, want %q", err, stderr.String(), tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o := cfg.storageOptions(netip.MustParseAddrPort("127.0.0.1:9090"), nil); o.MaxOpenQueueFiles != tc.want {
				t.Fatalf("MaxOpenQueueFiles %d, want %d", o.MaxOpenQueueFiles, tc.want)
			}
		})
	}
}

func TestConfigErrors(t *testing.T) {
	cases := []struct {
		name string
		args []string
		env  []string
		want string // in stderr
	}{
		{"unknown flag", []string{"--nope"}, nil, "flag provided but not defined"},
		{"bad flush mode", []string{"--flush-mode", "sometimes"}, nil, "unknown flush mode"},
		{"bad role", []string{"--role", "boss"}, nil, "unknown role"},
		{"bad populate mode", []string{"--populate", "eager"}, nil, "unknown populate mode"},
		{"bad size", []string{"--file-size", "1 parsec"}, nil, "unknown unit"},
		{"bad log level", []string{"--log-level", "loud"}, nil, "log-level"},
		{"bad log format", []string{"--log-format", "xml"}, nil, "json or console"},
		{"bad env names the variable", nil, []string{"STORAGED_FLUSH_INTERVAL", "soon"}, "STORAGED_FLUSH_INTERVAL"},
		{"bad env bool", nil, []string{"STORAGED_PPROF", "maybe"}, "STORAGED_PPROF"},
		{"positional args", []string{"serve"}, nil, "unexpected arguments"},
		{"zero shutdown timeout", []string{"--shutdown-timeout", "0s"}, nil, "must be positive"},
		{"cert without key", []string{"--tls-cert", "c.pem"}, nil, "go together"},
		{"client CA without cert", []string{"--tls-client-ca", "ca.pem"}, nil, "needs --tls-cert"},
		{"bad store host", []string{"--store-host", "example.com:1"}, nil, "ip:port"},
		{"store host name alone", []string{"--store-host", "storaged-0"}, nil, "ip:port or ip"},
		{"store host ip, bad port", []string{"--store-host", "10.0.0.1:http"}, nil, "ip:port or ip"},
		{"empty data dir", []string{"--data-dir", ""}, nil, "--data-dir"},
		{"file size too small", []string{"--file-size", "1KiB", "--max-message-size", "512"}, nil, "FileSize"},
		{"zero file reserved time", []string{"--file-reserved-time", "0s"}, nil, "--file-reserved-time must not be 0"},
		{"bad delete-when hour", []string{"--delete-when", "25"}, nil, "DeleteWhen"},
		{"bad delete-when env", nil, []string{"STORAGED_DELETE_WHEN", "4am"}, "DeleteWhen"},
		{"empty delete-when", []string{"--delete-when", ""}, nil, "--delete-when must not be empty"},
		{"clean above warning", []string{"--disk-clean-percent", "95"}, nil, "must not be above --disk-warning-percent"},
		{"warning above 100", []string{"--disk-warning-percent", "101"}, nil, "between 1 and 100"},
		{"zero clean percent", []string{"--disk-clean-percent", "0"}, nil, "between 1 and 100"},
		{"bad percent env", nil, []string{"STORAGED_DISK_WARNING_PERCENT", "90%"}, "STORAGED_DISK_WARNING_PERCENT"},
		{"zero disk check interval", []string{"--disk-check-interval", "0s"}, nil, "must be positive"},
		{"negative checkpoint interval", []string{"--checkpoint-interval", "-1s"}, nil, "must be positive"},
		{"bad delay unit", []string{"--delay-levels", "1s 5x"}, nil, "bad unit"},
		{"empty delay levels", []string{"--delay-levels", " "}, nil, "--delay-levels must not be empty"},
		{"zero default queues", []string{"--default-queues", "0"}, nil, "--default-queues 0 out of range"},
		{"default queues above the bound", nil, []string{"STORAGED_DEFAULT_QUEUES", "2147483647"}, "--default-queues 2147483647 out of range"},
		{"zero max topics", []string{"--max-topics", "0"}, nil, "--max-topics 0 must be positive"},
		{"max topics above the bound", []string{"--max-topics", "2000000"}, nil, "MaxTopics"},
		{"zero max timer messages", []string{"--max-timer-messages", "0"}, nil, "--max-timer-messages 0 out of range"},
		{"timer max delay under a second", []string{"--timer-max-delay", "500ms"}, nil, "--timer-max-delay 500ms out of range"},
		{"bad auto-create env", nil, []string{"STORAGED_AUTO_CREATE_TOPICS", "sometimes"}, "STORAGED_AUTO_CREATE_TOPICS"},
		{"admin on the data port", []string{"--listen", "127.0.0.1:7000", "--admin-listen", "127.0.0.1:7000"}, nil, "--admin-listen must differ"},
		{"zero pull inflight bytes", []string{"--max-pull-inflight-bytes", "0"}, nil, "--max-pull-inflight-bytes 0 must be positive"},
		{"zero pull wait", []string{"--max-pull-wait", "0s"}, nil, "--max-pull-wait 0s must be positive"},
		{"negative dedup window", []string{"--dedup-window", "-1s"}, nil, "--dedup-window -1s must not be negative"},
		{"zero dedup bound", []string{"--dedup-max-messages", "0"}, nil, "--dedup-max-messages 0 must be positive"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var stderr bytes.Buffer
			_, err := parseConfig(tc.args, env(tc.env...), &stderr)
			var uerr usageError
			if !errors.As(err, &uerr) {
				t.Fatalf("error %v, want a usageError", err)
			}
			if !strings.Contains(stderr.String(), tc.want) {
				t.Errorf("stderr %q does not mention %q", stderr.String(), tc.want)
			}
		})
	}
	var stderr bytes.Buffer
	if _, err := parseConfig([]string{"-h"}, env(), &stderr); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: %v", err)
	}
	if !strings.Contains(stderr.String(), "STORAGED_DATA_DIR") {
		t.Errorf("usage does not explain the environment twins: %s", stderr.String())
	}
}

func TestParseSize(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "4096": 4096, "64KiB": 64 << 10, "64kib": 64 << 10, "64K": 64 << 10, "4MiB": 4 << 20, "4M": 4 << 20,
		"1GiB": 1 << 30, "1g": 1 << 30, "2TiB": 2 << 40, "100MB": 100e6, "1GB": 1e9, "512B": 512, " 8 MiB ": 8 << 20,
	} {
		got, err := parseSize(in)
		if err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "MiB", "-1", "1.5GiB", "1 parsec", "99999999999TiB"} {
		if got, err := parseSize(in); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", in, got)
		}
	}
	for n, want := range map[int64]string{1 << 30: "1GiB", 64 << 10: "64KiB", 1000: "1000", 3 << 20: "3MiB", 0: "0"} {
		if got := formatSize(n); got != want {
			t.Errorf("formatSize(%d) = %q, want %q", n, got, want)
		}
	}
}

func TestStoreHost(t *testing.T) {
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(netip.MustParseAddrPort(s)) }
	cases := []struct {
		flag  string
		bound net.Addr
		want  string
	}{
		{"", tcp("0.0.0.0:9090"), "127.0.0.1:9090"},
		{"", tcp("[::]:9090"), "127.0.0.1:9090"},
		{"", tcp("127.0.0.1:40001"), "127.0.0.1:40001"},
		{"", tcp("10.1.2.3:9090"), "10.1.2.3:9090"},
		{"", tcp("[::ffff:10.1.2.3]:9090"), "10.1.2.3:9090"},
		{"", tcp("[2001:db8::5]:9090"), "[2001:db8::5]:9090"},
		{"10.9.8.7:10911", tcp("0.0.0.0:9090"), "10.9.8.7:10911"},
		// An ip alone (Kubernetes: $(POD_IP)) takes the bound port.
		{"10.9.8.7", tcp("0.0.0.0:9090"), "10.9.8.7:9090"},
		{"fd00:10:244::7", tcp("[::]:9090"), "[fd00:10:244::7]:9090"},
		{"::ffff:10.9.8.7", tcp("[::]:40002"), "10.9.8.7:40002"},
	}
	for _, c := range cases {
		cfg := config{StoreHost: c.flag}
		got, err := cfg.storeHost(c.bound)
		if err != nil || got.String() != c.want {
			t.Errorf("storeHost(%q, %v) = %v, %v; want %s", c.flag, c.bound, got, err, c.want)
		}
	}
	if _, err := (&config{}).storeHost(&net.UnixAddr{Name: "/s", Net: "unix"}); err == nil {
		t.Error("unix listener: no error")
	}
}

// TestConfigMaxConnections: --max-connections and STORAGED_MAX_CONNECTIONS
// (the flag wins), 0 derives half of RLIMIT_NOFILE, negative is no bound.
func TestConfigMaxConnections(t *testing.T) {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	derived := int(min(max(rl.Cur/2, minMaxConnections), maxMaxConnections))
	for _, c := range []struct {
		name string
		args []string
		env  []string
		want int
	}{
		{"default: half of RLIMIT_NOFILE", nil, nil, derived},
		{"explicit 0 derives too", []string{"--max-connections", "0"}, nil, derived},
		{"env", nil, []string{"STORAGED_MAX_CONNECTIONS", "300"}, 300},
		{"flag over env", []string{"--max-connections=50"}, []string{"STORAGED_MAX_CONNECTIONS", "300"}, 50},
		{"negative: no bound", []string{"--max-connections=-1"}, nil, -1},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := parseConfig(c.args, env(c.env...), &bytes.Buffer{})
			if err != nil {
				t.Fatal(err)
			}
			if cfg.MaxConnections != c.want {
				t.Errorf("MaxConnections = %d, want %d", cfg.MaxConnections, c.want)
			}
		})
	}
	var stderr bytes.Buffer
	parseConfig([]string{"-h"}, env(), &stderr)
	if !strings.Contains(stderr.String(), "-max-connections") || !strings.Contains(stderr.String(), "RLIMIT_NOFILE") {
		t.Errorf("usage does not document --max-connections:\n%s", stderr.String())
	}
}

// TestConfigDedupOff: --dedup-window 0 turns deduplication off in the
// store (a negative storage.Options.DedupWindow).
func TestConfigDedupOff(t *testing.T) {
	cfg, err := parseConfig([]string{"--dedup-window", "0"}, env(), &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if o := cfg.storageOptions(netip.MustParseAddrPort("127.0.0.1:9090"), nil); o.DedupWindow >= 0 {
		t.Fatalf("storage DedupWindow %v, want negative (off)", o.DedupWindow)
	}
}

// TestConfigTransactions: the transaction flags and their environment
// twins reach storage.Options; values out of range are refused.
func TestConfigTransactions(t *testing.T) {
	e := env("STORAGED_TRANSACTION_TIMEOUT", "2s", "STORAGED_MAX_PENDING_TRANSACTIONS", "7")
	cfg, err := parseConfig([]string{"--transaction-check-interval", "3s", "--transaction-check-max", "4"}, e, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	o := cfg.storageOptions(netip.MustParseAddrPort("127.0.0.1:9090"), nil)
	if o.TransactionTimeout != 2*time.Second || o.TransactionCheckInterval != 3*time.Second || o.TransactionCheckMax != 4 || o.MaxPendingTransactions != 7 {
		t.Fatalf("options %v %v %d %d", o.TransactionTimeout, o.TransactionCheckInterval, o.TransactionCheckMax, o.MaxPendingTransactions)
	}
	for _, args := range [][]string{
		{"--transaction-timeout", "10ms"}, {"--transaction-check-interval", "25h"},
		{"--transaction-check-max", "0"}, {"--max-pending-transactions", "0"},
	} {
		if _, err := parseConfig(args, env(), &bytes.Buffer{}); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
}
