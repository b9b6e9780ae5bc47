#!/usr/bin/env bash
# bench-r3-ab.sh: an A/B of two storaged builds as replication groups of three, on long-lived
# processes, beside one sync single node (BENCHMARKS.md "Two flushes per Ready").
#
#   scripts/bench-r3-ab.sh A_BINARY B_BINARY ROUNDS DURATION CASE...
#   CASE: unary-c1 | unary-c16 | unary-c64 | batch100-c16
#
# Starts a sync node (A's binary) and two groups (A on ports 19201-19213, B on 19301-19313), each
# member with its own data dir under a temporary dir, waits until the page cache's dirty bytes fall
# below 300 MB (the allocator's populate writeback of the first files), then runs ROUNDS rounds; in
# each, every CASE runs on sync, A and B in turn, B before A in even rounds, so that neither build
# always runs in the other's writeback (storaged-bench --addr LEADER, 2 s warmup). Prints
# msgs/s, p50 and the servers' CPU per message (bench-lib.sh's cpu: all three members of a group)
# per run. Needs storaged-bench on PATH or STORAGED_BENCH, python3, Linux /proc.
set -euo pipefail
a=$1 b=$2 rounds=$3 dur=$4
shift 4
bench=${STORAGED_BENCH:-storaged-bench}
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
bench_ab_start bench-r3-ab "$a"
declare -A procs # target -> its server processes, for their CPU time
procs[sync]=$sync_pid
group() { # name base-port binary
  local peers="1=127.0.0.1:$(($2 + 11)),2=127.0.0.1:$(($2 + 12)),3=127.0.0.1:$(($2 + 13))"
  for i in 1 2 3; do
    "$3" --listen "127.0.0.1:$(($2 + i))" --peer-listen "127.0.0.1:$(($2 + 10 + i))" --data-dir "$root/$1-$i" \
      --raft-id "$i" --raft-peers "$peers" "${common[@]}" >"$root/$1-$i.log" 2>&1 &
    pids+=($!)
    procs[$1]="${procs[$1]:-} $!"
  done
}
group A 19200 "$a"
group B 19300 "$b"
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null || echo "$3"; }
leader() { # base-port: the member that takes a put
  for i in 1 2 3; do
    rm -f "$root/l.json"
    "$bench" --addr "127.0.0.1:$(($1 + i))" --messages 20 --concurrency 1 --quiet --timeout 2s --warmup 0s \
      --json "$root/l.json" >/dev/null 2>&1 || true
    if [ "$(json "$root/l.json" 'd["messages"]' 0)" -ge 20 ]; then echo "127.0.0.1:$(($1 + i))"; return; fi
  done
}
bench_wait_writeback
for r in $(seq 1 "$rounds"); do
  for c in "$@"; do
    bench_case_args "$c"
    line="round $r $c load=$(cut -d' ' -f1 /proc/loadavg)"
    order="sync A B"
    if [ $((r % 2)) = 0 ]; then order="sync B A"; fi # neither build always runs after the other (its writeback)
    for t in $order; do
      case $t in sync) addr=127.0.0.1:19100 ;; A) addr=$(leader 19200) ;; B) addr=$(leader 19300) ;; esac
      rm -f "$root/r.json"
      # shellcheck disable=SC2086
      t0=$(ticks ${procs[$t]}) w0=$(date +%s.%N)
      GOGC=400 "$bench" --addr "$addr" "${args[@]}" --duration "$dur" --warmup 2s --quiet --json "$root/r.json" >/dev/null 2>&1 || true
      line="$line $t=$(json "$root/r.json" '"%d/p50=%.2fms" % (d["msgs_per_sec"], d["latency"]["p50_us"]/1000)' failed)"
      line="$line/cpu=$(cpu "$t" "$t0" "$w0" "$(json "$root/r.json" 'd["msgs_per_sec"]' 0)")us"
    done
    echo "$line"
  done
done
