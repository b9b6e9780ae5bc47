package main

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	iofs "io/fs"
	"strings"

	"github.com/storaged/storaged/storage"
)

// Exit statuses of the offline commands (check, repair).
const (
	exitOK       = 0
	exitDamage   = 1 // check: damage found; repair: the repair failed
	exitUsage    = 2
	exitCantRead = 3 // check could not run (data dir locked by a running storaged, I/O error, …)
)

// offlineFlags are the flags check and repair share with the server, with
// the same defaults and STORAGED_* environment twins.
type offlineFlags struct {
	dataDir  string
	fileSize int64
}

func (o *offlineFlags) register(fs *flag.FlagSet) {
	o.dataDir, o.fileSize = defaultDataDir, storage.DefaultFileSize
	fs.StringVar(&o.dataDir, "data-dir", o.dataDir, "data `directory` (the server's --data-dir)")
	fs.Var((*sizeValue)(&o.fileSize), "file-size", "commitlog file `size` the data dir was created with (the server's --file-size)")
}

func (o *offlineFlags) options() storage.Options {
	return storage.Options{Dir: o.dataDir, FileSize: o.fileSize}
}

// args are the flags that name this data dir on a command line, for the
// commands printed as advice.
func (o *offlineFlags) args() string {
	s := "--data-dir " + shellQuote(o.dataDir)
	if o.fileSize != storage.DefaultFileSize {
		s += " --file-size " + formatSize(o.fileSize)
	}
	return s
}

// parseOffline parses the flags of an offline command: the environment
// twins first, then the command line.
func parseOffline(fs *flag.FlagSet, args []string, lookupEnv func(string) (string, bool)) error {
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if v, ok := lookupEnv(envName(f.Name)); ok && envErr == nil {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", envName(f.Name), v, err)
			}
		}
	})
	if envErr != nil {
		fmt.Fprintf(fs.Output(), "storaged %s: %v\n", fs.Name(), envErr)
		return envErr
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		err := fmt.Errorf("unexpected arguments %q", fs.Args())
		fmt.Fprintf(fs.Output(), "storaged %s: %v\n", fs.Name(), err)
		return err
	}
	return nil
}

// checkOutput is what storaged check prints: storage.CheckReport plus where
// the damage is and what to run about it.
type checkOutput struct {
	DataDir         string `json:"data_dir"`
	Files           int    `json:"files"`
	Records         int64  `json:"records"`
	End             int64  `json:"end"`
	Flushed         int64  `json:"flushed"`
	Damaged         bool   `json:"damaged"`
	Damage          string `json:"damage,omitempty"`
	DamageOffset    *int64 `json:"damage_offset,omitempty"`
	DamageFile      string `json:"damage_file,omitempty"`
	BelowCheckpoint bool   `json:"below_checkpoint"`
	Repair          string `json:"repair,omitempty"`
}

// runCheck is `storaged check`: it verifies every record of the commitlog
// offline and prints a JSON report. Exit 0 without damage, 1 with damage.
func runCheck(args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o offlineFlags
	o.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: storaged check [--data-dir D] [--file-size S]\n\n"+
			"Verifies every record of the commitlog (magic, sizes, CRCs, offsets) with the server stopped, and\n"+
			"prints a JSON report. Exit status: 0 no damage, 1 damage found, 2 usage error, 3 could not check\n"+
			"(for example the data dir is locked by a running storaged). Changes nothing.\n\n")
		fs.PrintDefaults()
	}
	if err := parseOffline(fs, args, lookupEnv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	rep, err := storage.Check(o.options())
	if err != nil {
		fmt.Fprintf(stderr, "storaged check: %s\n", offlineError(err, o.dataDir))
		return exitCantRead
	}
	out := checkOutput{
		DataDir: o.dataDir, Files: rep.Files, Records: rep.Records, End: rep.End, Flushed: rep.Flushed,
		Damaged: rep.Damage != "", Damage: rep.Damage, BelowCheckpoint: rep.BelowCheckpoint,
	}
	if out.Damaged {
		off := rep.DamageOffset
		out.DamageOffset = &off
		out.DamageFile = fmt.Sprintf("commitlog/%020d", off/o.fileSize*o.fileSize)
		out.Repair = fmt.Sprintf("storaged repair %s --truncate-at %d", o.args(), off)
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(stderr, "storaged check: %v\n", err)
		return exitCantRead
	}
	if out.Damaged {
		fmt.Fprintf(stderr, "storaged check: damage at commitlog offset %d in %s: %s\n"+
			"To cut the log there (the bytes from there on are kept in .broken files, not served), stop storaged and run:\n  %s\n",
			rep.DamageOffset, out.DamageFile, rep.Damage, out.Repair)
		return exitDamage
	}
	return exitOK
}

// runRepair is `storaged repair --truncate-at OFFSET`: it cuts the
// commitlog at a record boundary (storage.Repair) and says what it did.
func runRepair(args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("repair", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o offlineFlags
	o.register(fs)
	truncateAt, set := int64(-1), false
	fs.Func("truncate-at", "commitlog `offset` to cut the log at: a record boundary, normally the damage_offset of storaged check", func(s string) error {
		var n int64
		if _, err := fmt.Sscan(s, &n); err != nil || n < 0 || fmt.Sprint(n) != strings.TrimSpace(s) {
			return fmt.Errorf("want a non-negative commitlog offset, got %q", s)
		}
		truncateAt, set = n, true
		return nil
	})
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: storaged repair [--data-dir D] [--file-size S] --truncate-at OFFSET\n\n"+
			"Cuts the commitlog at OFFSET with the server stopped: the bytes from OFFSET on are moved to\n"+
			"commitlog/<offset>.broken files (kept, never served), later files are removed, the consume queues are\n"+
			"dropped (the next start rebuilds them) and the checkpoint is rewritten. Every message at or after\n"+
			"OFFSET is no longer served. Run storaged check first: it prints the offset.\n\n")
		fs.PrintDefaults()
	}
	if err := parseOffline(fs, args, lookupEnv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if !set {
		fmt.Fprintf(stderr, "storaged repair: --truncate-at OFFSET is required; storaged repair never picks the offset itself.\n"+
			"Run `storaged check %s`: it prints the damage offset and the repair command.\n", o.args())
		return exitUsage
	}
	before, err := storage.Check(o.options())
	if err != nil {
		fmt.Fprintf(stderr, "storaged repair: %s\n", offlineError(err, o.dataDir))
		return exitDamage
	}
	fmt.Fprintf(stdout, "data dir %s: %d files, %d valid records ending at commitlog offset %d, flushed checkpoint %d\n",
		o.dataDir, before.Files, before.Records, before.End, before.Flushed)
	if before.Damage != "" {
		fmt.Fprintf(stdout, "damage at commitlog offset %d: %s\n", before.DamageOffset, before.Damage)
		if truncateAt != before.DamageOffset {
			fmt.Fprintf(stdout, "note: cutting at %d, not at the damage offset %d\n", truncateAt, before.DamageOffset)
		}
	} else {
		fmt.Fprintf(stdout, "note: no damage found; cutting at %d drops valid records\n", truncateAt)
	}
	if err := storage.Repair(o.options(), truncateAt); err != nil {
		fmt.Fprintf(stderr, "storaged repair: %s\n", offlineError(err, o.dataDir))
		return exitDamage
	}
	fmt.Fprintf(stdout, "cut the commitlog at offset %d: the bytes from there on are in commitlog/*.broken, later files removed\n", truncateAt)
	fmt.Fprintf(stdout, "dropped the consume queues: the next start rebuilds them from the commitlog\n")
	fmt.Fprintf(stdout, "rewrote the checkpoint: flushed offset %d\n", truncateAt)
	after, err := storage.Check(o.options())
	switch {
	case err != nil:
		fmt.Fprintf(stderr, "storaged repair: check after the repair: %s\n", offlineError(err, o.dataDir))
		return exitDamage
	case after.Damage != "":
		fmt.Fprintf(stdout, "check after the repair still finds damage at %d: %s\n", after.DamageOffset, after.Damage)
		return exitDamage
	}
	fmt.Fprintf(stdout, "check after the repair: no damage, %d records ending at %d; storaged can start\n", after.Records, after.End)
	return exitOK
}

// offlineError explains the errors an operator can act on.
func offlineError(err error, dataDir string) string {
	switch {
	case errors.Is(err, storage.ErrLocked):
		return fmt.Sprintf("data dir %s is in use by a running storaged: stop it first (%v)", dataDir, err)
	case errors.Is(err, iofs.ErrNotExist):
		return fmt.Sprintf("data dir %s has no commitlog: is --data-dir right? (%v)", dataDir, err)
	}
	return err.Error()
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("/._-+=:,@", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
