#!/usr/bin/env bash
# End-to-end load test: one axum hello-world served bare, behind tower-throttle (memory and Redis) and
# behind its peers (tower_governor, tower-redis-cell, tower-rate-limiter, a hand-written CL.THROTTLE
# middleware), all in one run on this machine. Prints a table of requests/s and ratios to bare, and
# writes it as CSV to $CSV (default target/loadtest/results.csv) for scripts/bench_chart.py.
#
#   bash scripts/loadtest.sh                  # every variant, 4 rounds of 2 s pairs (about 5 minutes)
#   ROUNDS=6 DURATION=3 bash scripts/loadtest.sh
#   bash scripts/loadtest.sh bare throttle-mem-pass governor-pass   # only these variants
#   bash scripts/loadtest.sh && python3 scripts/bench_chart.py      # BENCHMARKS.md's table and chart
#   WORKERS=8 bash scripts/loadtest.sh bare throttle-mem-pass governor-headers-pass   # many cores
#
# The servers come from loadtest/ (its own Cargo workspace, so the peers never enter tower-throttle's
# dependency graph), built in release into target/. Every server runs on CPU 0 (`taskset -c 0`, one
# tokio thread each, idle unless measured); the load (`wrk -t1 -c32`) and redis-server run on CPU 1. Each
# round measures every variant right after bare, and the table gives the median of these paired
# ratios: interference from other work on the machine hits both halves of a pair alike.
#
# WORKERS=N (default 1) measures a many-core server instead: each server runs N tokio workers on
# CPUs 0..N-1, the load N wrk threads (CONNECTIONS defaults to 32 per worker) on CPUs N..2N-1 and
# redis-server on those too; SERVER_CPU and LOAD_CPU override the lists (taskset's syntax).
#
# The load generator (scripts/loadgen.sh): wrk where installed, else oha (`cargo install oha --locked`
# into target/tools/oha when missing); LOADGEN=oha picks oha. Needs also redis-server, redis-cli,
# taskset, curl, python3 (Debian: apt-get install wrk redis-server redis-tools util-linux curl python3)
# and the redis-cell module (built by `bash scripts/test.sh --setup-only`); redis-server, redis-cli and
# the module only when a Redis variant is measured. LOADTEST_BIN=PATH runs that prebuilt
# loadtest-server instead of building one (a machine without cargo: scripts/many-core.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

ROUNDS=${ROUNDS:-4}
DURATION=${DURATION:-2}
WORKERS=${WORKERS:-1}
[[ $WORKERS =~ ^[1-9][0-9]*$ ]] || { echo "loadtest.sh: WORKERS must be a count of 1 or more" >&2; exit 2; }
CONNECTIONS=${CONNECTIONS:-$((32 * WORKERS))}
if ((WORKERS == 1)); then
  SERVER_CPU=${SERVER_CPU:-0}
  LOAD_CPU=${LOAD_CPU:-1}
else
  SERVER_CPU=${SERVER_CPU:-0-$((WORKERS - 1))}
  LOAD_CPU=${LOAD_CPU:-$WORKERS-$((2 * WORKERS - 1))}
  (($(nproc) >= 2 * WORKERS)) || echo "loadtest.sh: WORKERS=$WORKERS wants $((2 * WORKERS)) cores; this machine has $(nproc)" >&2
fi
export LOADGEN_THREADS=${LOADGEN_THREADS:-$WORKERS}
# Only with more than one worker, so that a server built before --workers existed (BIN=) still runs.
WORKER_ARGS=(); ((WORKERS == 1)) || WORKER_ARGS=(--workers "$WORKERS")
MODULE=${REDIS_CELL_MODULE:-$ROOT/target/redis-cell/libredis_cell.so}

say() { printf 'loadtest.sh: %s\n' "$*" >&2; }
die() {
  say "error: $*"
  exit 1
}

CSV=${CSV:-$ROOT/target/loadtest/results.csv}

ALL=(
  bare
  throttle-mem-pass
  throttle-mem-deny
  throttle-mem-pass-noheaders
  throttle-axumbody-pass
  throttle-axumbody-deny
  throttle-axumbody-pass-noheaders
  governor-pass
  governor-headers-pass
  governor-deny
  throttle-lua-pass
  throttle-lua-alone-pass
  throttle-cell-alone-pass
  throttle-lua-lease-pass
  throttle-cell-pass
  redis-cell-peer-pass
  rate-limiter-peer-pass
  handwritten-cell-pass
  throttle-lua-deny
  throttle-lua-deny-nocache
  throttle-cell-deny
  redis-cell-peer-deny
  rate-limiter-peer-deny
  handwritten-cell-deny
)
if (($#)); then
  # Every variant is paired with bare: named or not, it is measured once.
  VARIANTS=(bare)
  for v in "$@"; do [[ $v == bare ]] || VARIANTS+=("$v"); done
else
  VARIANTS=("${ALL[@]}")
fi
# Redis is started only for the variants that decide on it.
NEED_REDIS=
for v in "${VARIANTS[@]}"; do
  case $v in bare | throttle-mem-* | throttle-axumbody-* | governor-*) ;; *) NEED_REDIS=1 ;; esac
done

TOOLS=(taskset python3)
[[ -n $NEED_REDIS ]] && TOOLS+=(redis-server redis-cli)
for tool in "${TOOLS[@]}"; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (Debian: apt-get install wrk redis-server redis-tools util-linux curl python3)"
done
# shellcheck source=scripts/loadgen.sh
source scripts/loadgen.sh
loadgen_pick || die "no load generator"
say "load generator: $LOADGEN ($LOADGEN_BIN)"
if [[ -n $NEED_REDIS && ! -f $MODULE ]]; then
  say "the redis-cell module is missing; building it with scripts/test.sh --setup-only"
  bash scripts/test.sh --setup-only
fi

if [[ -n ${LOADTEST_BIN:-} ]]; then
  BIN=$LOADTEST_BIN
  [[ -x $BIN ]] || die "LOADTEST_BIN=$BIN is not an executable"
else
  # tower-rate-limiter 0.2.0-alpha.0 declares rust-version 1.96; it builds on older toolchains, so
  # the load-test crate (and only it) is built with --ignore-rust-version.
  say "building loadtest/ (release)"
  LOADTEST_TARGET=${LOADTEST_TARGET:-$ROOT/target}
  (cd loadtest && CARGO_TARGET_DIR=$LOADTEST_TARGET cargo build --release --locked --ignore-rust-version -q) ||
    die "cargo build of loadtest/ failed"
  BIN=$LOADTEST_TARGET/release/loadtest-server
fi

TMP=$(mktemp -d)
REDIS_PID=
SERVER_PID=
cleanup() {
  local rc=$?
  # shellcheck disable=SC2086
  [[ -n $SERVER_PID ]] && kill $SERVER_PID 2>/dev/null && wait $SERVER_PID 2>/dev/null || true
  [[ -n $REDIS_PID ]] && kill "$REDIS_PID" 2>/dev/null && wait "$REDIS_PID" 2>/dev/null || true
  rm -rf "$TMP"
  exit "$rc"
}
trap cleanup EXIT

free_port() {
  local port
  while :; do
    # Below Linux's ephemeral range (32768-60999), which wrk's own connections use.
    port=$((20000 + RANDOM % 12000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
}

# answers PORT: whether a GET / there gets an HTTP answer (curl where installed, else bash's /dev/tcp).
answers() {
  if command -v curl >/dev/null 2>&1; then
    curl -s -o /dev/null "http://127.0.0.1:$1/"
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$1" && printf 'GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n' >&3 &&
      head -c 5 <&3 | grep -q '^HTTP/') 2>/dev/null
  fi
}

# redis_cli ARGS...: redis-cli on the test server, or nothing when no variant needs Redis.
redis_cli() { [[ -z $NEED_REDIS ]] || redis-cli -p "$RPORT" "$@"; }

if [[ -n $NEED_REDIS ]]; then
  RPORT=$(free_port)
  taskset -c "$LOAD_CPU" redis-server --port "$RPORT" --bind 127.0.0.1 --dir "$TMP" --save "" \
    --appendonly no --loadmodule "$MODULE" >"$TMP/redis.log" 2>&1 &
  REDIS_PID=$!
  for _ in $(seq 100); do
    redis-cli -p "$RPORT" PING 2>/dev/null | grep -q PONG && break
    sleep 0.1
  done
  redis-cli -p "$RPORT" PING 2>/dev/null | grep -q PONG || {
    cat "$TMP/redis.log" >&2
    die "redis-server did not start"
  }
  REDIS_URL=redis://127.0.0.1:$RPORT/
else
  REDIS_URL=redis://127.0.0.1:1/
fi

# start VARIANT: starts its server on CPU 0 and prints its port. A first request exhausts the "deny"
# quotas (1 an hour) before anything is measured.
declare -A PORT PID
start() {
  local variant=$1 port attempt pid
  for attempt in 1 2 3; do
    port=$(free_port)
    taskset -c "$SERVER_CPU" "$BIN" "$variant" --listen "127.0.0.1:$port" --redis "$REDIS_URL" ${WORKER_ARGS[@]+"${WORKER_ARGS[@]}"} \
      >"$TMP/$variant.log" 2>&1 &
    pid=$!
    for _ in $(seq 100); do
      answers "$port" && break
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      PORT[$variant]=$port
      PID[$variant]=$pid
      return
    fi
    # A port taken between the check and the bind: try another one.
    wait "$pid" 2>/dev/null || true
    say "$variant exited at start (attempt $attempt): $(grep -m1 -v '^ ' "$TMP/$variant.log" || true)"
  done
  cat "$TMP/$variant.log" >&2
  die "$variant did not start"
}

# measure VARIANT -> "rps total non2xx"
measure() {
  loadgen_run "$LOAD_CPU" "$CONNECTIONS" "$DURATION" "http://127.0.0.1:${PORT[$1]}/"
}

for v in "${VARIANTS[@]}"; do
  start "$v"
done
SERVER_PID="${PID[*]}"
say "started ${#VARIANTS[@]} servers; measuring"

# Each round measures every variant right after bare (a pair), so both see the same interference;
# the table reports the median of the paired ratios and of the requests/s.
declare -A RATIOS RPS TOTAL NON2XX REDIS_US REDIS_CALLS
for round in $(seq "$ROUNDS"); do
  for v in "${VARIANTS[@]}"; do
    [[ $v == bare ]] && continue
    read -r brps btotal bnon <<<"$(measure bare)"
    redis_cli CONFIG RESETSTAT >/dev/null
    read -r rps total non2xx <<<"$(measure "$v")"
    # Redis's CPU (INFO commandstats: usec of the commands clients sent, which for a script
    # includes the commands it calls; those are listed again on their own lines and not added) and
    # calls, per request measured.
    read -r usec calls <<<"$(redis_cli INFO commandstats | tr -d '\r' |
      awk -F'[=,]' '$1 ~ /^cmdstat_(evalsha|eval|evalsha_ro|eval_ro|fcall|cl\.throttle):calls$/ {c += $2; u += $4} END {print u + 0, c + 0}')"
    REDIS_US[$v]+="$(awk -v u="$usec" -v t="$total" 'BEGIN {printf "%.2f", u / t}') "
    REDIS_CALLS[$v]+="$(awk -v c="$calls" -v t="$total" 'BEGIN {printf "%.3f", c / t}') "
    ratio=$(awk -v a="$rps" -v b="$brps" 'BEGIN {printf "%.3f", a / b}')
    say "round $round: bare $brps, $v $rps req/s ($non2xx of $total not 200): $ratio"
    RATIOS[$v]+="$ratio "
    RPS[$v]+="$rps "
    RPS[bare]+="$brps "
    TOTAL[$v]=$((${TOTAL[$v]:-0} + total))
    NON2XX[$v]=$((${NON2XX[$v]:-0} + non2xx))
    TOTAL[bare]=$((${TOTAL[bare]:-0} + btotal))
    NON2XX[bare]=$((${NON2XX[bare]:-0} + bnon))
  done
done
RATIOS[bare]="1 "

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
range() { tr ' ' '\n' | grep -v '^$' | sort -g | awk 'NR == 1 {lo = $1} {hi = $1} END {printf "%.3f %.3f", lo, hi}'; }
# kind VARIANT: how the chart colours it (this crate, a peer, or the baseline).
kind() { case $1 in bare) echo bare ;; throttle-*) echo tower-throttle ;; *) echo peer ;; esac; }

CAPTION=$(printf '%s, %s cores, %s; server: %s tokio worker(s) on CPU %s; %s on CPU %s; %s rounds, each variant paired with bare' \
  "$(uname -m)" "$(nproc)" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" \
  "$WORKERS" "$SERVER_CPU" "$(loadgen_describe "$CONNECTIONS" "$DURATION")" "$LOAD_CPU" "$ROUNDS")
mkdir -p "$(dirname "$CSV")"
{
  printf '# %s; %s\n' "$CAPTION" "$(date -u +%Y-%m-%dT%H:%MZ)"
  echo variant,kind,ratio_median,ratio_min,ratio_max,rounds,rps_median,ok_percent,non2xx_percent,redis_us_per_request,redis_calls_per_request
} >"$CSV"
printf '\n%s\n\n' "$CAPTION"
printf '| variant | requests/s (median) | × bare (median of pairs) | range of pairs | 200 | 429 (non-2xx) | Redis µs / request | Redis calls / request |\n'
printf '|---|---:|---:|---|---:|---:|---:|---:|\n'
for v in "${VARIANTS[@]}"; do
  read -r lo hi <<<"$(range <<<"${RATIOS[$v]}")"
  rounds=$(wc -w <<<"${RATIOS[$v]}")
  [[ $v == bare ]] && rounds=$ROUNDS
  awk -v v="$v" -v k="$(kind "$v")" -v r="$(median <<<"${RPS[$v]}")" -v x="$(median <<<"${RATIOS[$v]}")" \
    -v lo="$lo" -v hi="$hi" -v rounds="$rounds" -v t="${TOTAL[$v]}" -v n="${NON2XX[$v]}" \
    -v u="$(median <<<"${REDIS_US[$v]:-0}")" -v c="$(median <<<"${REDIS_CALLS[$v]:-0}")" -v csv="$CSV" \
    'BEGIN {
       printf "| %s | %.0f | %.3f | %.2f-%.2f | %.1f%% | %.1f%% | %.2f | %.3f |\n", v, r, x, lo, hi, 100 * (t - n) / t, 100 * n / t, u, c
       printf "%s,%s,%.3f,%.3f,%.3f,%d,%.0f,%.1f,%.1f,%.2f,%.3f\n", v, k, x, lo, hi, rounds, r, 100 * (t - n) / t, 100 * n / t, u, c >> csv
     }'
done
say "wrote $CSV (draw it: python3 scripts/bench_chart.py)"
