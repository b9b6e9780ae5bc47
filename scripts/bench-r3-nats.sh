#!/usr/bin/env bash
# bench-r3-nats.sh: storaged's replication group of three beside NATS JetStream R3, in one sitting
# (issue 13's "NATS JetStream R3 measured on this machine"; BENCHMARKS.md "r3 beside NATS R3").
#
#   scripts/bench-r3-nats.sh STORAGED_BINARY ROUNDS DURATION CASE...
#   CASE: unary-c1 | unary-c16 | unary-c64 | batch100-c16
#
# Starts one sync storaged node (ports 19100), a storaged group of three (19201-19213) and three
# nats-servers clustered on loopback (clients 19601-19603, routes 19611-19613) with JetStream
# file storage and sync_interval: always (an ack only after fsync, as storaged's sync mode), each
# with its own data dir under a temporary dir. Waits until the page cache's dirty bytes fall
# below 300 MB (storaged's populate writeback), then runs ROUNDS rounds; in each, every CASE runs
# on sync, r3 and nats-r3 in turn. storaged: storaged-bench --addr LEADER, 2 s warmup. NATS:
# `nats bench js pub` into a stream of 3 replicas (4 GiB at most), new for each run, as many messages as
# the previous nats run of the case did in DURATION (the first run calibrates: it is printed but
# a round-1 figure comes from a run sized by a guess); sync publishers for unary-cN (N clients),
# async batches of 100 acks for batch100-c16 (`pub async --batch 100`, 16 clients).
# Prints msgs/s, p50 and the servers' CPU per message (all the target's processes, from
# /proc/PID/stat over the whole run) per run.
#
# Needs storaged-bench, nats-server and nats (natscli) on PATH, or STORAGED_BENCH, NATS_SERVER,
# NATS; python3; Linux /proc. scripts/bench-peers.sh installs nats-server v2.15.2 and natscli v0.5.0
# into bin/ (`GOBIN=bin go install github.com/nats-io/nats-server/v2@v2.15.2`, the same for
# github.com/nats-io/natscli/nats@v0.5.0).
set -euo pipefail
bin=$1 rounds=$2 dur=$3
shift 3
bench=${STORAGED_BENCH:-storaged-bench}
natsd=${NATS_SERVER:-nats-server}
nats=${NATS:-nats}
source "$(dirname "${BASH_SOURCE[0]}")/bench-lib.sh"
bench_ab_start bench-r3-nats "$bin"
declare -A procs # target -> its server processes, for their CPU time
procs[sync]=$sync_pid
peers="1=127.0.0.1:19211,2=127.0.0.1:19212,3=127.0.0.1:19213"
for i in 1 2 3; do
  "$bin" --listen "127.0.0.1:$((19200 + i))" --peer-listen "127.0.0.1:$((19210 + i))" --data-dir "$root/r3-$i" \
    --raft-id "$i" --raft-peers "$peers" "${common[@]}" >"$root/r3-$i.log" 2>&1 &
  pids+=($!)
  procs[r3]="${procs[r3]:-} $!"
done
routes="nats-route://127.0.0.1:19611, nats-route://127.0.0.1:19612, nats-route://127.0.0.1:19613"
for i in 1 2 3; do
  cat >"$root/nats-$i.conf" <<EOF
server_name: n$i
listen: "127.0.0.1:$((19600 + i))"
jetstream {
  store_dir: "$root/nats-$i"
  sync_interval: always
}
cluster {
  name: r3
  listen: "127.0.0.1:$((19610 + i))"
  routes: [$routes]
}
EOF
  "$natsd" -c "$root/nats-$i.conf" >"$root/nats-$i.log" 2>&1 &
  pids+=($!)
  procs[nats-r3]="${procs[nats-r3]:-} $!"
done
json() { python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1" 2>/dev/null || echo "$3"; }
leader() { # the storaged member that takes a put
  for i in 1 2 3; do
    rm -f "$root/l.json"
    "$bench" --addr "127.0.0.1:$((19200 + i))" --messages 20 --concurrency 1 --quiet --timeout 2s --warmup 0s \
      --json "$root/l.json" >/dev/null 2>&1 || true
    if [ "$(json "$root/l.json" 'd["messages"]' 0)" -ge 20 ]; then echo "127.0.0.1:$((19200 + i))"; return; fi
  done
}
natsbench() { # clients batch msgs: prints "RATE P50US" or "failed"
  local args=(-s nats://127.0.0.1:19601 --timeout 60s bench js pub)
  if [ "$2" -gt 1 ]; then args+=(async --batch "$2"); else args+=(sync); fi
  # One stream definition for every run (a different --maxbytes is a different configuration,
  # which --create refuses), removed before each run.
  "$nats" -s nats://127.0.0.1:19601 --timeout 60s stream rm benchstream -f >/dev/null 2>&1 || true
  args+=(storaged.bench --clients "$1" --size 1024 --msgs "$3" --maxbytes $((4 << 30))
    --create --purge --storage file --replicas 3 --no-progress)
  "$nats" "${args[@]}" >"$root/nats.out" 2>&1 || { echo failed; return; }
  python3 - "$root/nats.out" <<'PY'
import re, sys
out = open(sys.argv[1]).read()
m = re.search(r"publisher (?:aggregated )?stats: ([0-9,.]+) msgs/sec", out)
if not m:
    print("failed"); sys.exit()
rate = float(m.group(1).replace(",", ""))
l = re.search(r"P50:? ([0-9,.]+)us", out[m.end():])
print(int(rate), float(l.group(1).replace(",", "")) if l else -1)
PY
}
# The NATS cluster is up once a replicated stream takes messages.
for _ in $(seq 1 60); do
  [ "$(natsbench 1 1 10)" != failed ] && break
  sleep 1
done
bench_wait_writeback
declare -A natsmsgs
for r in $(seq 1 "$rounds"); do
  for c in "$@"; do
    bench_case_args "$c"
    case $c in # the same load for nats bench
    unary-c1) clients=1 batch=1 ;;
    unary-c16) clients=16 batch=1 ;;
    unary-c64) clients=64 batch=1 ;;
    batch100-c16) clients=16 batch=100 ;;
    esac
    line="round $r $c load=$(cut -d' ' -f1 /proc/loadavg)"
    for t in sync r3; do
      case $t in sync) addr=127.0.0.1:19100 ;; r3) addr=$(leader) ;; esac
      rm -f "$root/r.json"
      # shellcheck disable=SC2086
      t0=$(ticks ${procs[$t]}) w0=$(date +%s.%N)
      GOGC=400 "$bench" --addr "$addr" "${args[@]}" --duration "$dur" --warmup 2s --quiet --json "$root/r.json" >/dev/null 2>&1 || true
      line="$line $t=$(json "$root/r.json" '"%d/p50=%.2fms" % (d["msgs_per_sec"], d["latency"]["p50_us"]/1000)' failed)"
      line="$line/cpu=$(cpu "$t" "$t0" "$w0" "$(json "$root/r.json" 'd["msgs_per_sec"]' 0)")us"
    done
    n=${natsmsgs[$c]:-$((clients * batch * 200))}
    # shellcheck disable=SC2086
    t0=$(ticks ${procs[nats-r3]}) w0=$(date +%s.%N)
    res=$(natsbench "$clients" "$batch" "$n")
    if [ "$res" = failed ]; then
      line="$line nats-r3=failed"
    else
      read -r rate p50 <<<"$res"
      line="$line nats-r3=$rate/p50=$(python3 -c "print('%.2fms' % ($p50/1000))")/cpu=$(cpu nats-r3 "$t0" "$w0" "$rate")us/msgs=$n"
      natsmsgs[$c]=$(python3 -c "print(max(1000, int($rate * float('${dur%s}'))))")
    fi
    echo "$line"
  done
done
