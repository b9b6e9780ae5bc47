package main

import (
	"bytes"
	"errors"
	"flag"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/storaged/storaged/storage"
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
		Listen: ":9090", MetricsListen: ":9091", DataDir: "./data", FlushMode: storage.FlushAsync,
		FileSize: 1 << 30, FlushInterval: 500 * time.Millisecond, SyncFlushTimeout: 5 * time.Second,
		Role: storage.RoleMaster, MaxMessageSize: 4 << 20, LogLevel: zerolog.InfoLevel, LogFormat: "json",
		ShutdownTimeout: 30 * time.Second, Reflection: true,
	}
	if cfg != want {
		t.Errorf("defaults\n got %+v\nwant %+v", cfg, want)
	}
	// The defaults must make valid storage options.
	opts := cfg.storageOptions(netip.MustParseAddrPort("127.0.0.1:9090"), nil)
	if err := opts.Validate(); err != nil {
		t.Errorf("default storage options: %v", err)
	}
}

func TestConfigPrecedence(t *testing.T) {
	e := env("STORAGED_LISTEN", "127.0.0.1:7000", "STORAGED_DATA_DIR", "/env/data", "STORAGED_FLUSH_MODE", "sync",
		"STORAGED_FILE_SIZE", "64MiB", "STORAGED_REFLECTION", "false", "STORAGED_SHUTDOWN_TIMEOUT", "9s",
		"STORAGED_LOG_LEVEL", "debug", "STORAGED_ROLE", "slave", "STORAGED_METRICS_LISTEN", "")
	cfg, err := parseConfig([]string{"--data-dir", "/flag/data", "--file-size=128MiB", "-reflection=true"}, e, &bytes.Buffer{})
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
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
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
		{"empty data dir", []string{"--data-dir", ""}, nil, "--data-dir"},
		{"file size too small", []string{"--file-size", "1KiB", "--max-message-size", "512"}, nil, "FileSize"},
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
