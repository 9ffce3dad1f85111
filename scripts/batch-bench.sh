#!/usr/bin/env bash
# Redis CPU per decision (INFO commandstats: usec_per_call / decisions per call) and decisions per
# second inside one redis-server, for each way of deciding a GCRA: gcra.lua (and an older copy of it,
# OLD_GCRA=path, to measure a change in the same run), CL.THROTTLE, and gcra_batch.lua with batches of
# 1, 8 and 32 decisions, on one hot key and (batches) on 32 keys.
#
#   bash scripts/batch-bench.sh                        # 3 interleaved rounds of 50,000 calls per case
#   OLD_GCRA=/tmp/gcra-old.lua ROUNDS=5 bash scripts/batch-bench.sh
#
# Quota: a million a second, bursts of a million (every decision admitted and written). redis-server
# runs on CPU 0, redis-benchmark (-c 50, no pipelining) on CPU 1; medians over the rounds, with ranges.
#
# CLIENT=1 measures the crate's own client instead (benches/redis_cpu.rs, on CPU 1, against this
# server): 50 callers at once on one hot key, each path a decision can take (alone with
# coalesce(false), coalesced, CL.THROTTLE pipelined) for a GCRA, a sliding window and a stack;
# Redis µs per decision from INFO commandstats (the top-level commands' usec, which includes what a
# script calls), calls and commands per decision. Its settings: CALLERS, DECISIONS, ROUNDS, CASES.
#
#   CLIENT=1 ROUNDS=3 bash scripts/batch-bench.sh
#
# With BEFORE=path (a redis_cpu binary built from another tree, e.g. main: `cargo bench --bench
# redis_cpu --no-run` there, copy the executable it names), the two binaries alternate round by
# round against the same server (one round each at a time, before first), and the table gives each
# side's medians and the median of the per-round ratios after/before of Redis µs per decision.
#
#   BEFORE=/tmp/redis_cpu-main CLIENT=1 ROUNDS=5 CASES=gcra-coalesced,gcra-coalesced-1m \
#     bash scripts/batch-bench.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ROUNDS=${ROUNDS:-3}
N=${N:-50000}
MODULE=${REDIS_CELL_MODULE:-$ROOT/target/redis-cell/libredis_cell.so}
OLD_GCRA=${OLD_GCRA:-}

die() {
  printf 'batch-bench.sh: error: %s\n' "$*" >&2
  exit 1
}
for tool in redis-server redis-cli redis-benchmark taskset; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is missing"
done
[[ -f $MODULE ]] || die "the redis-cell module is missing (bash scripts/test.sh --setup-only)"

TMP=$(mktemp -d)
PID=
trap '[[ -n $PID ]] && kill $PID 2>/dev/null; rm -rf "$TMP"' EXIT
PORT=$((20000 + RANDOM % 30000))
taskset -c 0 redis-server --port "$PORT" --bind 127.0.0.1 --dir "$TMP" --save "" --appendonly no \
  --loadmodule "$MODULE" >"$TMP/redis.log" 2>&1 &
PID=$!
for _ in $(seq 100); do
  redis-cli -p "$PORT" PING 2>/dev/null | grep -q PONG && break
  sleep 0.1
done
cli() { redis-cli -p "$PORT" "$@"; }
cli PING | grep -q PONG || die "redis-server did not start: $(cat "$TMP/redis.log")"

if [[ ${CLIENT:-} == 1 ]]; then
  printf '%s; redis-server %s; %s CPUs, load %s\n' "$(uname -m)" \
    "$(cli INFO server | tr -d '\r' | awk -F: '$1 == "redis_version" {print $2}')" "$(nproc)" \
    "$(cut -d' ' -f1-3 /proc/loadavg)"
  if [[ -z ${BEFORE:-} ]]; then
    REDIS_URL=redis://127.0.0.1:$PORT/ ROUNDS=$ROUNDS taskset -c 1 cargo bench --bench redis_cpu -q
    exit
  fi
  AFTER=$(cargo bench --bench redis_cpu --no-run 2>&1 | sed -n 's/.*Executable .*(\(.*\))$/\1/p')
  [[ -x $AFTER && -x $BEFORE ]] || die "no bench executables: BEFORE=$BEFORE, this tree's: $AFTER"
  for round in $(seq "$ROUNDS"); do
    for side in before after; do
      bin=$BEFORE
      [[ $side == after ]] && bin=$AFTER
      REDIS_URL=redis://127.0.0.1:$PORT/ ROUNDS=1 taskset -c 1 "$bin" |
        awk -v s="$side" -v r="$round" '/^\| [a-z]/ && !/^\| case/ {print s, r, $0}' | tee -a "$TMP/rows" >&2
    done
  done
  python3 - "$TMP/rows" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    side, rnd, rest = line.split(' ', 2)
    cells = [c.strip() for c in rest.strip().strip('|').split('|')]
    # Latency columns (p50, p99 in µs) only from binaries that print them.
    cols = [float(cells[i]) if i < len(cells) else float('nan') for i in (1, 3, 4, 5, 6, 7)]
    rows.setdefault(cells[0], {}).setdefault(side, {})[rnd] = cols
print('| case | Redis µs / decision, before | after | after / before (median of rounds) | calls / decision, before / after | decisions/s, before / after | latency p50 µs, before / after | p99 µs, before / after |')
print('|---|---:|---:|---:|---:|---:|---:|---:|')
for case, sides in rows.items():
    b, a = sides.get('before', {}), sides.get('after', {})
    med = lambda d, j: statistics.median(v[j] for v in d.values()) if d else float('nan')
    ratios = [a[r][0] / b[r][0] for r in a if r in b and b[r][0]]
    ratio = statistics.median(ratios) if ratios else float('nan')
    lo, hi = (min(ratios), max(ratios)) if ratios else (ratio, ratio)
    print(f'| {case} | {med(b, 0):.2f} | {med(a, 0):.2f} | {ratio:.2f} ({lo:.2f}-{hi:.2f}) | '
          f'{med(b, 1):.3f} / {med(a, 1):.3f} | {med(b, 3):.0f} / {med(a, 3):.0f} | '
          f'{med(b, 4):.0f} / {med(a, 4):.0f} | {med(b, 5):.0f} / {med(a, 5):.0f} |')
PY
  exit
fi

# A script as the crate assembles it (src/backend/redis/wire/lua.rs): shebang, prelude, body.
assembled() { printf '#!lua\n'; cat src/backend/redis/wire/prelude.lua "src/backend/redis/wire/$1"; }
GCRA=$(cli SCRIPT LOAD "$(assembled gcra.lua)")
BATCH=$(cli SCRIPT LOAD "$(assembled gcra_batch.lua)")
ARGS="1000 1000001000 1000001 1"
batch() { # batch SIZE DISTINCT_KEYS -> "EVALSHA sha GROUPS keys... args..." as batch.rs sends it
  local size=$1 distinct=$2 keys="" args="" i
  if ((!distinct)); then
    echo "EVALSHA $BATCH 1 k $ARGS $size"
    return
  fi
  for ((i = 0; i < size; i++)); do
    keys+=" k$i"
    args+=" $ARGS 1"
  done
  echo "EVALSHA $BATCH $size$keys$args"
}

# name | decisions per call | command
CASES=(
  "gcra.lua|1|EVALSHA $GCRA 1 k $ARGS"
  "CL.THROTTLE|1|CL.THROTTLE k 1000000 1000000 1 1"
  "gcra_batch.lua x1|1|$(batch 1 0)"
  "gcra_batch.lua x8, one key|8|$(batch 8 0)"
  "gcra_batch.lua x32, one key|32|$(batch 32 0)"
  "gcra_batch.lua x32, 32 keys|32|$(batch 32 1)"
)
if [[ -n $OLD_GCRA ]]; then
  OLD=$(cli SCRIPT LOAD "$(cat "$OLD_GCRA")")
  CASES=("gcra.lua before|1|EVALSHA $OLD 1 k $ARGS" "${CASES[@]}")
fi

declare -A US RPS
for round in $(seq "$ROUNDS"); do
  for c in "${CASES[@]}"; do
    IFS='|' read -r name per cmd <<<"$c"
    cli FLUSHALL >/dev/null
    cli CONFIG RESETSTAT >/dev/null
    # shellcheck disable=SC2086
    rps=$(taskset -c 1 redis-benchmark -p "$PORT" -n "$N" -c 50 --csv $cmd |
      awk -F'"' 'NR == 2 {print $4}')
    command=$([[ $name == CL.THROTTLE ]] && echo cl.throttle || echo evalsha)
    usec=$(cli INFO commandstats | tr -d '\r' |
      awk -F'[=,]' -v c="cmdstat_$command:calls" '$1 == c {print $6}')
    US[$name]+="$(awk -v u="$usec" -v p="$per" 'BEGIN {printf "%.3f", u / p}') "
    RPS[$name]+="$(awk -v r="$rps" -v p="$per" 'BEGIN {printf "%.0f", r * p}') "
    printf 'round %s: %s: %s calls/s, %s us/call\n' "$round" "$name" "$rps" "$usec" >&2
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
range() { tr ' ' '\n' | grep -v '^$' | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%s-%s", lo, hi}'; }
printf '\nredis-server %s; redis-benchmark -n %s -c 50; medians of %s rounds\n\n' \
  "$(cli INFO server | tr -d '\r' | awk -F: '$1 == "redis_version" {print $2}')" "$N" "$ROUNDS"
printf '| path | Redis µs per decision | range | decisions/s | range |\n|---|---:|---|---:|---|\n'
for c in "${CASES[@]}"; do
  IFS='|' read -r name _ _ <<<"$c"
  printf '| %s | %s | %s | %s | %s |\n' "$name" "$(median <<<"${US[$name]}")" "$(range <<<"${US[$name]}")" \
    "$(median <<<"${RPS[$name]}")" "$(range <<<"${RPS[$name]}")"
done
