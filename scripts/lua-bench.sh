#!/usr/bin/env bash
# Decisions per second inside one Redis server: tower-throttle's script (src/backend/redis/wire/gcra.lua),
# redis-cell's CL.THROTTLE, and go-redis/redis_rate's allowN script (loadtest/redis_rate_allow_n.lua,
# a verbatim copy), measured with redis-benchmark on the same server in one run.
#
#   bash scripts/lua-bench.sh                 # 3 interleaved rounds of 100,000 calls per case
#   ROUNDS=5 N=200000 bash scripts/lua-bench.sh
#
# Same quota everywhere: 1,000,000 a second with bursts of 1,000,000 ("pass": every call admitted and
# written), and 1 an hour with burst 1 on an exhausted key ("limited": every call rejected, nothing
# written; hot key only). "hot key" is one key; "1M keys" a random key out of a million per call
# (__rand_int__).
# redis-server runs on CPU 0, redis-benchmark (-c 50, no pipelining) on CPU 1. The table gives the
# medians over the rounds of the calls/s and of each script's ratio to redis_rate within a round.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
ROUNDS=${ROUNDS:-3}
N=${N:-100000}
MODULE=${REDIS_CELL_MODULE:-$ROOT/target/redis-cell/libredis_cell.so}

die() {
  printf 'lua-bench.sh: error: %s\n' "$*" >&2
  exit 1
}
for tool in redis-server redis-cli redis-benchmark taskset; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (Debian: apt-get install redis-server redis-tools util-linux)"
done
[[ -f $MODULE ]] || bash scripts/test.sh --setup-only

# The redis_rate copy must be the published text (SHA-256 from tower-rate-limiter's notice).
[[ $(tail -n +7 loadtest/redis_rate_allow_n.lua | sha256sum | cut -d' ' -f1) == \
  eae9c9e4348a5e9d72358dc89e0c77c7a0f252e5a35869eaf5ebd2421659ea72 ]] ||
  die "loadtest/redis_rate_allow_n.lua is not go-redis/redis_rate v10.0.1's allowN script"

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

# A script as the crate assembles it (src/backend/redis/wire/lua.rs): shebang, prelude, body.
assembled() { printf '#!lua\n'; cat src/backend/redis/wire/prelude.lua "src/backend/redis/wire/$1"; }
OURS=$(cli SCRIPT LOAD "$(assembled gcra.lua)")
RATE=$(cli SCRIPT LOAD "$(cat loadtest/redis_rate_allow_n.lua)")

# name | command (KEY is replaced by the key)
# ours: interval_ns tolerance_ns limit quantity; CL.THROTTLE: max_burst count period quantity;
# redis_rate: burst rate period_s cost.
CASES=(
  "pass|tower-throttle gcra.lua|EVALSHA $OURS 1 KEY 1000 1000001000 1000001 1"
  "pass|CL.THROTTLE|CL.THROTTLE KEY 1000000 1000000 1 1"
  "pass|redis_rate allowN|EVALSHA $RATE 1 KEY 1000001 1000000 1 1"
  "limited|tower-throttle gcra.lua|EVALSHA $OURS 1 KEY 3600000000000 3600000000000 1 1"
  "limited|CL.THROTTLE|CL.THROTTLE KEY 0 1 3600 1"
  "limited|redis_rate allowN|EVALSHA $RATE 1 KEY 1 1 3600 1"
)

declare -A THIS RPS RATIOS
for round in $(seq "$ROUNDS"); do
  for keys in "hot key" "1M keys"; do
    for c in "${CASES[@]}"; do
      IFS='|' read -r path name cmd <<<"$c"
      # Random keys are fresh keys: their first call passes, so "limited" is measured on the hot key.
      [[ $keys == "1M keys" && $path == limited ]] && continue
      cli FLUSHALL >/dev/null
      if [[ $keys == "hot key" ]]; then key=k; rand=(); else key=k:__rand_int__; rand=(-r 1000000); fi
      # shellcheck disable=SC2086
      if [[ $path == limited ]]; then
        # Exhaust the hot key first (a random key's first call passes: 1 in a million calls).
        cli ${cmd//KEY/k} >/dev/null
      fi
      # shellcheck disable=SC2086
      rps=$(taskset -c 1 redis-benchmark -p "$PORT" -n "$N" -c 50 "${rand[@]}" --csv ${cmd//KEY/$key} |
        awk -F'","' 'NR == 2 {print $2}')
      id="$keys|$path|$name"
      printf 'lua-bench.sh: round %s: %s, %s, %s: %s calls/s\n' "$round" "$keys" "$path" "$name" "$rps" >&2
      THIS[$id]=$rps
      RPS[$id]+="$rps "
    done
    # Ratios within the round: interference hits the three scripts of one round alike.
    for c in "${CASES[@]}"; do
      IFS='|' read -r path name _ <<<"$c"
      [[ $keys == "1M keys" && $path == limited ]] && continue
      RATIOS["$keys|$path|$name"]+="$(awk -v a="${THIS["$keys|$path|$name"]}" \
        -v b="${THIS["$keys|$path|redis_rate allowN"]}" 'BEGIN {printf "%.3f", a / b}') "
    done
  done
done

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }

printf '\nredis-server %s, %s; redis-benchmark -n %s -c 50, medians of %s rounds\n\n' \
  "$(redis-server --version | awk '{print $3}' | cut -d= -f2)" \
  "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" "$N" "$ROUNDS"
printf '| keys | path | script | decisions/s | × redis_rate (same round) | per round |\n|---|---|---|---:|---:|---|\n'
for keys in "hot key" "1M keys"; do
  for c in "${CASES[@]}"; do
    IFS='|' read -r path name _ <<<"$c"
    [[ $keys == "1M keys" && $path == limited ]] && continue
    id="$keys|$path|$name"
    awk -v k="$keys" -v p="$path" -v n="$name" -v r="$(median <<<"${RPS[$id]}")" \
      -v x="$(median <<<"${RATIOS[$id]}")" -v all="${RATIOS[$id]}" \
      'BEGIN { printf "| %s | %s | %s | %.0f | %.2f | %s |\n", k, p, n, r, x, all }'
  done
done
