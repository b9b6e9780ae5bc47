# bench-lib.sh: shared by scripts/bench-*.sh (source it; it is not a command).
#
# bench_build OUTDIR builds OUTDIR/storaged and OUTDIR/storaged-bench and sets BENCH_REV_NOTE.
#   STORAGED_REV=<git rev> (default HEAD): both binaries are built from a clean export of that revision
#     (git archive), with the working tree's cmd/storaged-bench copied over it, so that half-edited files
#     elsewhere in a shared working tree neither break the build nor end up in the measurement.
#   STORAGED_REV=worktree: both are built from the working tree as it is.

bench_root() {
  git -C "$(dirname "${BASH_SOURCE[0]}")" rev-parse --show-toplevel
}

bench_build() {
  local out=$1 root rev src
  root=$(bench_root)
  rev=${STORAGED_REV:-HEAD}
  mkdir -p "$out"
  if [ "$rev" = worktree ]; then
    src=$root
    BENCH_REV_NOTE="storaged built from the working tree at $(git -C "$root" rev-parse --short HEAD) (+ uncommitted changes)"
  else
    src=$out/src
    rm -rf "$src"
    mkdir -p "$src"
    git -C "$root" archive "$rev" | tar -x -C "$src"
    rm -rf "$src/cmd/storaged-bench"
    cp -r "$root/cmd/storaged-bench" "$src/cmd/storaged-bench"
    BENCH_REV_NOTE="storaged built from $(git -C "$root" rev-parse --short "$rev") ($(git -C "$root" log -1 --format=%s "$rev" | cut -c1-80))"
  fi
  (cd "$src" && go build -o "$out/storaged" ./cmd/storaged && go build -o "$out/storaged-bench" ./cmd/storaged-bench)
  echo "bench: $BENCH_REV_NOTE" >&2
}

# bench_machine prints the date and machine lines BENCHMARKS.md records.
bench_machine() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "nproc: $(nproc)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
  echo "kernel: $(uname -r)"
  echo "go: $(go env GOVERSION)"
}

# bench_ab_start NAME SYNC_BINARY: the start of the A/B scripts (bench-r3-ab.sh, bench-r3-nats.sh):
# a temporary dir $root, a $pids array whose processes are killed (and $root removed) at exit, the
# storaged flags every process takes ($common), and a sync node on 127.0.0.1:19100 ($sync_pid).
bench_ab_start() {
  root=$(mktemp -d "${TMPDIR:-/tmp}/$1.XXXXXX")
  pids=()
  trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$root"' EXIT
  common=(--metrics-listen 127.0.0.1:0 --admin-listen= --log-level warn)
  "$2" --listen 127.0.0.1:19100 --data-dir "$root/sync" --flush-mode sync "${common[@]}" >"$root/sync.log" 2>&1 &
  sync_pid=$!
  pids+=("$sync_pid")
}

# ticks PID...: the CPU time of processes, in clock ticks (utime + stime).
ticks() {
  local t=0 p
  for p in "$@"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done
  echo "$t"
}
# cpu TARGET T0 WALL0 RATE: the target's servers' CPU per message over the run (warmup included,
# at the same load), in µs.
cpu() { # uses the associative array procs: target -> its server processes
  # shellcheck disable=SC2086
  python3 -c "import sys; t, w, r = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]); print('%.0f' % (t / $(getconf CLK_TCK) / w / r * 1e6) if r > 0 and w > 0 else '-')" \
    "$(($(ticks ${procs[$1]}) - $2))" "$(python3 -c "import time; print(time.time() - $3)")" "$4"
}

# bench_case_args CASE: sets the array args to storaged-bench's flags for a case of the A/B scripts
# (unary-c1, unary-c16, unary-c64, batch100-c16); exits 2 on another.
bench_case_args() {
  case $1 in
  unary-c1) args=(--method unary --concurrency 1) ;;
  unary-c16) args=(--method unary --concurrency 16) ;;
  unary-c64) args=(--method unary --concurrency 64) ;;
  batch100-c16) args=(--method batch --batch-size 100 --concurrency 16) ;;
  *) echo "unknown case $1" >&2; exit 2 ;;
  esac
}

# bench_wait_writeback waits (2 minutes at most) until the page cache's dirty bytes fall below 300 MB:
# the allocator's populate writeback of the servers' first files, which would weigh on the first runs.
bench_wait_writeback() {
  for _ in $(seq 1 60); do
    [ "$(awk '/^Dirty:/{print $2}' /proc/meminfo)" -lt 300000 ] && break
    sleep 2
  done
}
