package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"time"
)

// Methods the generator drives.
const (
	methodUnary  = "unary"  // PutMessage, one message per call
	methodBatch  = "batch"  // PutMessages, --batch-size messages per call
	methodStream = "stream" // PutMessageStream, one message per request
)

// loadConfig is what one load run does. The zero value is not valid; start
// from defaultLoadConfig.
type loadConfig struct {
	Method    string
	BodySize  int
	BatchSize int // messages per PutMessages call; 1 for unary and stream
	// Concurrency is the number of calls in flight (unary, batch), or the
	// number of messages in flight on each stream (stream).
	Concurrency int
	Streams     int // stream: number of PutMessageStream calls
	Connections int // gRPC client connections; calls are spread round-robin
	// Exactly one of Duration and Messages bounds the measured phase.
	Duration time.Duration
	Messages int64
	Warmup   time.Duration // unmeasured load before the measured phase
	Timeout  time.Duration // deadline of each call (unary, batch)
	Topic    string
	Queues   int    // queue ids 0..Queues-1, taken round-robin
	Tags     string // tag of every message ("" = none)
	Label    string
	// MetricsURL, when set, is a Prometheus endpoint of the server that is
	// read every second for its heap (go_memstats_heap_inuse_bytes).
	MetricsURL string
}

func defaultLoadConfig() loadConfig {
	return loadConfig{
		Method:      methodUnary,
		BodySize:    1024,
		BatchSize:   100,
		Concurrency: 64,
		Streams:     1,
		Connections: 1,
		Duration:    10 * time.Second,
		Warmup:      time.Second,
		Timeout:     30 * time.Second,
		Topic:       "bench",
		Queues:      8,
	}
}

// callSize is the number of messages of one call.
func (c *loadConfig) callSize() int {
	if c.Method == methodBatch {
		return c.BatchSize
	}
	return 1
}

// inFlight is the number of messages in flight at full load.
func (c *loadConfig) inFlight() int {
	if c.Method == methodStream {
		return c.Concurrency * c.Streams
	}
	return c.Concurrency * c.callSize()
}

func (c *loadConfig) validate() error {
	var errs []error
	switch c.Method {
	case methodUnary, methodBatch, methodStream:
	default:
		errs = append(errs, fmt.Errorf("--method %q: want unary, batch or stream", c.Method))
	}
	if c.BodySize <= 0 {
		errs = append(errs, errors.New("--body-size must be positive"))
	}
	if c.BatchSize <= 0 {
		errs = append(errs, errors.New("--batch-size must be positive"))
	}
	if c.Concurrency <= 0 || c.Streams <= 0 || c.Connections <= 0 || c.Queues <= 0 {
		errs = append(errs, errors.New("--concurrency, --streams, --connections and --queues must be positive"))
	}
	if (c.Duration > 0) == (c.Messages > 0) {
		errs = append(errs, errors.New("give exactly one of --duration and --messages"))
	}
	if c.Duration < 0 || c.Messages < 0 || c.Warmup < 0 || c.Timeout <= 0 {
		errs = append(errs, errors.New("--duration, --messages and --warmup must not be negative, --timeout must be positive"))
	}
	if c.Topic == "" {
		errs = append(errs, errors.New("--topic must not be empty"))
	}
	return errors.Join(errs...)
}

// addLoadFlags registers the flags of a load run on fs, writing into c.
// Duration and messages are registered here too: --messages overrides the
// default --duration (see resolveBound).
func addLoadFlags(fs *flag.FlagSet, c *loadConfig) {
	fs.StringVar(&c.Method, "method", c.Method, "`method`: unary (PutMessage), batch (PutMessages) or stream (PutMessageStream)")
	fs.IntVar(&c.BodySize, "body-size", c.BodySize, "message body size in `bytes`")
	fs.IntVar(&c.BatchSize, "batch-size", c.BatchSize, "messages per PutMessages call (batch)")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "calls in flight (unary, batch); messages in flight per stream (stream)")
	fs.IntVar(&c.Streams, "streams", c.Streams, "number of PutMessageStream streams (stream); in flight = concurrency x streams")
	fs.IntVar(&c.Connections, "connections", c.Connections, "gRPC client connections; calls are spread round-robin")
	fs.DurationVar(&c.Duration, "duration", c.Duration, "length of the measured phase (excludes --warmup)")
	fs.Int64Var(&c.Messages, "messages", 0, "send this many measured messages instead of running for --duration")
	fs.DurationVar(&c.Warmup, "warmup", c.Warmup, "unmeasured load before the measured phase")
	fs.DurationVar(&c.Timeout, "timeout", c.Timeout, "deadline of each call")
	fs.StringVar(&c.Topic, "topic", c.Topic, "topic of the messages")
	fs.IntVar(&c.Queues, "queues", c.Queues, "spread the messages over queue ids 0..`N`-1")
	fs.StringVar(&c.Tags, "tags", c.Tags, "`tag` of every message (Message.tags); empty sends none")
	fs.StringVar(&c.Label, "label", c.Label, "free-form label recorded in the summary (e.g. the flush mode)")
}

// resolveBound makes --messages win over the default --duration unless
// --duration was given explicitly too (then validate reports the clash).
func resolveBound(fs *flag.FlagSet, c *loadConfig) {
	durationSet := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "duration" {
			durationSet = true
		}
	})
	if c.Messages > 0 && !durationSet {
		c.Duration = 0
	}
}

// runOptions is the command line of the run subcommand.
type runOptions struct {
	load      loadConfig
	addr      string
	floor     bool
	floorKind string
	tls       tlsOptions
	jsonPath  string
	quiet     bool
}

func parseRunOptions(args []string, stderr io.Writer) (runOptions, error) {
	o := runOptions{load: defaultLoadConfig(), floorKind: floorGRPC}
	fs := flag.NewFlagSet("storaged-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.addr, "addr", "", "target `host:port` of a storaged gRPC server")
	fs.BoolVar(&o.floor, "floor", false, "start an in-process no-op server on 127.0.0.1:0 and load it instead of --addr")
	fs.StringVar(&o.floorKind, "floor-kind", o.floorKind, "floor `kind`: grpc (no-op handler, storaged's server options and interceptors), "+
		"bare (no-op handler, grpc defaults), edge (storaged's server package over a store that stores nothing)")
	fs.StringVar(&o.jsonPath, "json", "", "write the final summary as JSON to `file` (- for stdout)")
	fs.BoolVar(&o.quiet, "quiet", false, "no progress line")
	fs.StringVar(&o.load.MetricsURL, "metrics-url", "", "read go_memstats_heap_inuse_bytes from this Prometheus `URL` every second")
	addLoadFlags(fs, &o.load)
	o.tls.addFlags(fs)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: storaged-bench [run] (--addr HOST:PORT | --floor) [flags]\n"+
			"       storaged-bench floor|matrix|chart -h\n\n")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args); err != nil {
		return o, err
	}
	resolveBound(fs, &o.load)
	fail := func(err error) (runOptions, error) {
		fmt.Fprintln(stderr, "storaged-bench:", err)
		return o, usageError{err}
	}
	if fs.NArg() > 0 {
		return fail(fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if err := o.load.validate(); err != nil {
		return fail(err)
	}
	switch {
	case o.floor && o.addr != "":
		return fail(errors.New("give --addr or --floor, not both"))
	case !o.floor && o.addr == "":
		return fail(errors.New("give --addr HOST:PORT or --floor"))
	case o.floor && o.tls.enabled():
		return fail(errors.New("the floor serves plaintext: TLS options need --addr"))
	}
	if err := validFloorKind(o.floorKind); err != nil {
		return fail(err)
	}
	if o.addr != "" {
		if _, _, err := net.SplitHostPort(o.addr); err != nil {
			return fail(fmt.Errorf("--addr: %w", err))
		}
	}
	return o, nil
}

// runLoadCommand is the run subcommand.
func runLoadCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parseRunOptions(args, stderr)
	if err != nil {
		return err
	}
	addr, target := o.addr, o.addr
	if o.floor {
		f, err := startFloor(o.floorKind, "127.0.0.1:0", nil)
		if err != nil {
			return err
		}
		defer f.Stop()
		addr, target = f.Addr(), "floor:"+o.floorKind
		fmt.Fprintf(stderr, "floor (%s) listening on %s\n", o.floorKind, addr)
	}
	creds, err := o.tls.credentials()
	if err != nil {
		return usageError{err}
	}
	conns, err := dial(addr, o.load.Connections, creds)
	if err != nil {
		return err
	}
	defer closeAll(conns)

	var progress io.Writer = stderr
	if o.quiet {
		progress = io.Discard
	}
	sum, err := runLoad(ctx, o.load, conns, progress)
	if err != nil {
		return err
	}
	sum.Target = target
	sum.TLS = o.tls.enabled()
	sum.printText(stdout)
	if o.jsonPath != "" {
		if err := writeJSON(o.jsonPath, stdout, sum); err != nil {
			return err
		}
	}
	return nil
}

// writeJSON writes v as indented JSON to path, or to stdout for "-".
func writeJSON(path string, stdout io.Writer, v any) error {
	b, err := marshalIndent(v)
	if err != nil {
		return err
	}
	if path == "-" {
		_, err = stdout.Write(b)
		return err
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
