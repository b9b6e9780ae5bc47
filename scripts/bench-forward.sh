#!/usr/bin/env bash
# bench-forward.sh: what a forwarded put costs (storaged --raft-forward-puts, BENCHMARKS.md
# "Forwarded puts"): one replication group of three with forwarding on, each case run against the
# leader (direct) and against a follower (forwarded) in turn, round after round.
#
#   scripts/bench-forward.sh BINARY ROUNDS DURATION CASE...
#   CASE: unary-c1 | unary-c16 | unary-c64 | batch100-c16
#
# Members on 127.0.0.1:19401-19403 (peers 19411-19413), data dirs under a temporary dir. The two
# targets alternate which runs first from round to round. Prints
# msgs/s, p50, p99 and the three members' CPU per message (bench-lib.sh's cpu) per run. Needs
# storaged-bench on PATH or STORAGED_BENCH, python3, Linux /proc.
set -euo pipefail
bin=$1 rounds=$2 dur=$3
shift 3
bench=${STORAGED_BENCH:-storaged-bench}
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
root=$(mktemp -d "${TMPDIR:-/tmp}/bench-forward.XXXXXX")
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$root"' EXIT
declare -A procs
peers="1=127.0.0.1:19411,2=127.0.0.1:19412,3=127.0.0.1:19413"
for i in 1 2 3; do
  "$bin" --listen "127.0.0.1:1940$i" --peer-listen "127.0.0.1:1941$i" --data-dir "$root/m$i" --raft-id "$i" \
    --raft-peers "$peers" --raft-forward-puts --metrics-listen 127.0.0.1:0 --admin-listen= --log-level warn \
    >"$root/m$i.log" 2>&1 &
  pids+=($!)
  procs[group]="${procs[group]:-} $!"
done
procs[leader]=${procs[group]}
procs[follower]=${procs[group]}
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null || echo "$3"; }
role() { # addr: leader, follower, candidate or none (storaged replica members: its GetReplicaInfo)
  "$bin" replica members --addr "$1" 2>/dev/null | python3 -c "import json,sys; d=json.load(sys.stdin); print(d['role'])" 2>/dev/null || echo none
}
for _ in $(seq 1 60); do
  l=""
  for i in 1 2 3; do [ "$(role 127.0.0.1:1940$i)" = leader ] && l=127.0.0.1:1940$i; done
  [ -n "$l" ] && break
  sleep 1
done
bench_wait_writeback
bench_machine
for r in $(seq 1 "$rounds"); do
  for c in "$@"; do
    bench_case_args "$c"
    line="round $r $c load=$(cut -d' ' -f1 /proc/loadavg)"
    order="leader follower"
    if [ $((r % 2)) = 0 ]; then order="follower leader"; fi # alternate, so neither always runs after the other
    for t in $order; do
      addr=""
      for i in 1 2 3; do
        role=$(role 127.0.0.1:1940$i)
        if [ "$t" = leader ] && [ "$role" = leader ]; then addr=127.0.0.1:1940$i; fi
        if [ "$t" = follower ] && [ "$role" = follower ] && [ -z "$addr" ]; then addr=127.0.0.1:1940$i; fi
      done
      rm -f "$root/r.json"
      # shellcheck disable=SC2086
      t0=$(ticks ${procs[$t]}) w0=$(date +%s.%N)
      GOGC=400 "$bench" --addr "$addr" "${args[@]}" --duration "$dur" --warmup 2s --quiet --json "$root/r.json" >/dev/null 2>&1 || true
      line="$line $t=$(json "$root/r.json" '"%d/p50=%.2fms/p99=%.2fms" % (d["msgs_per_sec"], d["latency"]["p50_us"]/1000, d["latency"]["p99_us"]/1000)' failed)"
      line="$line/cpu=$(cpu "$t" "$t0" "$w0" "$(json "$root/r.json" 'd["msgs_per_sec"]' 0)")us"
    done
    echo "$line"
  done
done
