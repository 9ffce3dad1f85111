#!/usr/bin/env bash
# Redis CPU per decision on one hot key, 50 callers at once, for every path a decision takes (alone,
# coalesced, CL.THROTTLE pipelined), GCRA, sliding window and a stack: benches/redis_cpu.rs against a
# redis-server (with redis-cell) of its own, pinned to CPU 1 (the bench on CPU 0).
#
#   bash scripts/redis-cpu.sh
#   ROUNDS=5 DECISIONS=50000 CASES=stack-alone,stack-coalesced bash scripts/redis-cpu.sh
set -euo pipefail
cd "$(dirname "$0")/.."
MODULE=${REDIS_CELL_MODULE:-$PWD/target/redis-cell/libredis_cell.so}
die() {
  printf 'redis-cpu.sh: error: %s\n' "$*" >&2
  exit 1
}
for tool in redis-server redis-cli taskset; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (Debian: apt-get install redis-server redis-tools util-linux)"
done
[[ -f $MODULE ]] || die "the redis-cell module is missing (bash scripts/test.sh --setup-only)"
cargo bench --bench redis_cpu --no-run -q 2>/dev/null || cargo bench --bench redis_cpu --no-run
TMP=$(mktemp -d)
PID=
trap '[[ -n $PID ]] && kill $PID 2>/dev/null; rm -rf "$TMP"' EXIT
PORT=$((20000 + RANDOM % 30000))
taskset -c 1 redis-server --port "$PORT" --bind 127.0.0.1 --dir "$TMP" --save "" --appendonly no \
  --loadmodule "$MODULE" >"$TMP/redis.log" 2>&1 &
PID=$!
for _ in $(seq 100); do
  redis-cli -p "$PORT" PING 2>/dev/null | grep -q PONG && break
  sleep 0.1
done
redis-cli -p "$PORT" PING | grep -q PONG || die "redis-server did not start: $(cat "$TMP/redis.log")"
printf '%s; redis-server %s; %s\n' "$(uname -m)" "$(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/')" \
  "$(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
REDIS_URL=redis://127.0.0.1:$PORT/ taskset -c 0 cargo bench --bench redis_cpu -q
