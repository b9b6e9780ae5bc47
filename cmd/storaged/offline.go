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
	// exitCheckpoint: check found the checkpoint file corrupt and every
	// commitlog record valid; `storaged repair --rebuild-checkpoint` fixes it.
	// (A corrupt checkpoint with commitlog damage too is exitDamage.)
	exitCheckpoint = 4
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
	// CheckpointDamage says why the checkpoint file cannot be trusted;
	// flushed is then 0 (unknown).
	CheckpointDamage string `json:"checkpoint_damage,omitempty"`
	CheckpointFile   string `json:"checkpoint_file,omitempty"`
	Repair           string `json:"repair,omitempty"`
}

// runCheck is `storaged check`: it verifies every record of the commitlog
// and the checkpoint offline and prints a JSON report. Exit 0 without
// damage, 1 with commitlog damage, 4 with only the checkpoint corrupt.
func runCheck(args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("check", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var o offlineFlags
	o.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: storaged check [--data-dir D] [--file-size S]\n\n"+
			"Verifies every record of the commitlog (magic, sizes, CRCs, offsets) and the checkpoint file with\n"+
			"the server stopped, and prints a JSON report. Exit status: 0 no damage, 1 commitlog damage found,\n"+
			"2 usage error, 3 could not check (for example the data dir is locked by a running storaged), 4 the\n"+
			"checkpoint is corrupt and every commitlog record is valid (storaged repair --rebuild-checkpoint).\n"+
			"Changes nothing.\n\n")
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
		CheckpointDamage: rep.CheckpointDamage, CheckpointFile: rep.CheckpointFile,
	}
	if out.Damaged {
		off := rep.DamageOffset
		out.DamageOffset = &off
		out.DamageFile = fmt.Sprintf("commitlog/%020d", off/o.fileSize*o.fileSize)
		out.Repair = fmt.Sprintf("storaged repair %s --truncate-at %d", o.args(), off)
		if storage.IsReplicaDir(o.options()) {
			// A group member never cuts entries it may have acknowledged.
			out.Repair = fmt.Sprintf("storaged replica repair %s --from ID=HOST:PORT", o.args())
		}
	} else if out.CheckpointDamage != "" {
		out.Repair = fmt.Sprintf("storaged repair %s --rebuild-checkpoint", o.args())
	}
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		fmt.Fprintf(stderr, "storaged check: %v\n", err)
		return exitCantRead
	}
	if out.CheckpointDamage != "" {
		fmt.Fprintf(stderr, "storaged check: the checkpoint file %s is corrupt: %s\n"+
			"Every message is still in the commitlog, but storaged cannot tell which were acknowledged durable and will not start.\n",
			out.CheckpointFile, out.CheckpointDamage)
		if !out.Damaged {
			fmt.Fprintf(stderr, "Every commitlog record is valid. To write a new checkpoint from them (the old one is kept as\n"+
				"checkpoint.corrupt-<time>; the next start rescans the whole commitlog and rebuilds the consume queues), run:\n  %s\n",
				out.Repair)
			return exitCheckpoint
		}
	}
	if out.Damaged {
		if storage.IsReplicaDir(o.options()) {
			fmt.Fprintf(stderr, "storaged check: damage at commitlog offset %d in %s: %s\n"+
				"This data dir belongs to a replication group member: do not cut its log. With it stopped, fetch the damaged\n"+
				"entries from another member (its id and peer address, the leader is best):\n  %s\n",
				rep.DamageOffset, out.DamageFile, rep.Damage, out.Repair)
			return exitDamage
		}
		fmt.Fprintf(stderr, "storaged check: damage at commitlog offset %d in %s: %s\n"+
			"To cut the log there (the bytes from there on are kept in .broken files, not served), stop storaged and run:\n  %s\n",
			rep.DamageOffset, out.DamageFile, rep.Damage, out.Repair)
		return exitDamage
	}
	return exitOK
}

// runRepair is `storaged repair --truncate-at OFFSET`: it cuts the
// commitlog at a record boundary (storage.Repair) and says what it did;
// `storaged repair --rebuild-checkpoint` replaces a corrupt checkpoint
// (storage.RebuildCheckpoint).
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
	var rebuild bool
	fs.BoolVar(&rebuild, "rebuild-checkpoint", false, "set a corrupt checkpoint aside as checkpoint.corrupt-<time> and write a new one from a full check of the commitlog")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), "Usage: storaged repair [--data-dir D] [--file-size S] --truncate-at OFFSET\n"+
			"       storaged repair [--data-dir D] [--file-size S] --rebuild-checkpoint\n\n"+
			"Cuts the commitlog at OFFSET with the server stopped: the bytes from OFFSET on are moved to\n"+
			"commitlog/<offset>.broken files (kept, never served), later files are removed, the consume queues are\n"+
			"dropped (the next start rebuilds them) and the checkpoint is rewritten. Every message at or after\n"+
			"OFFSET is no longer served. Run storaged check first: it prints the offset.\n\n"+
			"--rebuild-checkpoint replaces a corrupt checkpoint: it checks every commitlog record (refusing if any is\n"+
			"damaged: use --truncate-at, which rewrites the checkpoint too), keeps the old file as\n"+
			"checkpoint.corrupt-<time>, drops the consume queues and writes a checkpoint at the end of the valid\n"+
			"log. Nothing is cut; the next start rescans the whole commitlog and rebuilds the consume queues.\n\n")
		fs.PrintDefaults()
	}
	if err := parseOffline(fs, args, lookupEnv); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if !set && !rebuild {
		fmt.Fprintf(stderr, "storaged repair: --truncate-at OFFSET is required (or --rebuild-checkpoint for a corrupt checkpoint); "+
			"storaged repair never picks the offset itself.\n"+
			"Run `storaged check %s`: it prints the damage offset and the repair command.\n", o.args())
		return exitUsage
	}
	if !set {
		return rebuildCheckpoint(o, stdout, stderr)
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
	if before.CheckpointDamage != "" {
		fmt.Fprintf(stdout, "the checkpoint is corrupt (%s): it is set aside as checkpoint.corrupt-<time> and rewritten\n", before.CheckpointDamage)
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

// rebuildCheckpoint is `storaged repair --rebuild-checkpoint`.
func rebuildCheckpoint(o offlineFlags, stdout, stderr io.Writer) int {
	before, err := storage.Check(o.options())
	if err != nil {
		fmt.Fprintf(stderr, "storaged repair: %s\n", offlineError(err, o.dataDir))
		return exitDamage
	}
	if before.Damage != "" {
		fmt.Fprintf(stderr, "storaged repair: the commitlog is damaged at offset %d (%s): a rebuilt checkpoint would cut the log there.\n"+
			"Cut it explicitly instead (that rewrites the checkpoint too):\n  storaged repair %s --truncate-at %d\n",
			before.DamageOffset, before.Damage, o.args(), before.DamageOffset)
		return exitDamage
	}
	if before.CheckpointDamage == "" {
		fmt.Fprintf(stdout, "note: the checkpoint is not corrupt; replacing it anyway\n")
	}
	aside, err := storage.RebuildCheckpoint(o.options())
	if err != nil {
		fmt.Fprintf(stderr, "storaged repair: %s\n", offlineError(err, o.dataDir))
		return exitDamage
	}
	if aside != "" {
		fmt.Fprintf(stdout, "set the old checkpoint aside as %s\n", aside)
	}
	fmt.Fprintf(stdout, "checked %d records in %d files, all valid, ending at commitlog offset %d\n", before.Records, before.Files, before.End)
	fmt.Fprintf(stdout, "wrote a new checkpoint: flushed offset %d; dropped the consume queues\n", before.End)
	fmt.Fprintf(stdout, "the next start scans the whole commitlog and rebuilds the consume queues; nothing was cut\n")
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
