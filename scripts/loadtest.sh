#!/usr/bin/env bash
# End-to-end load test: one axum hello-world served bare, behind tower-throttle (memory and Redis) and
# behind its peers (tower_governor, tower-redis-cell, tower-rate-limiter, a hand-written CL.THROTTLE
# middleware), all in one run on this machine. Prints a table of requests/s and ratios to bare.
#
#   bash scripts/loadtest.sh                  # every variant, 2 rounds of 5 s each (about 4 minutes)
#   ROUNDS=3 DURATION=10 bash scripts/loadtest.sh
#   bash scripts/loadtest.sh bare throttle-mem-pass governor-pass   # only these variants
#
# The servers come from loadtest/ (its own Cargo workspace, so the peers never enter tower-throttle's
# dependency graph), built in release into target/. The server runs on CPU 0 (`taskset -c 0`, one
# tokio thread); wrk (`wrk -t1 -c32`) and redis-server run on CPU 1. Rounds are interleaved (every
# variant once per round, bare included) and each variant's best round is reported: noise from other
# work on the machine only ever lowers a figure.
#
# Needs: wrk, redis-server, redis-cli, taskset, curl (Debian: apt-get install wrk redis-server
# redis-tools util-linux curl) and the redis-cell module (built by `bash scripts/test.sh --setup-only`).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

ROUNDS=${ROUNDS:-2}
DURATION=${DURATION:-5}
CONNECTIONS=${CONNECTIONS:-32}
SERVER_CPU=${SERVER_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
MODULE=${REDIS_CELL_MODULE:-$ROOT/target/redis-cell/libredis_cell.so}

say() { printf 'loadtest.sh: %s\n' "$*" >&2; }
die() {
  say "error: $*"
  exit 1
}

for tool in wrk redis-server redis-cli taskset curl; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is missing (Debian: apt-get install wrk redis-server redis-tools util-linux curl)"
done
if [[ ! -f $MODULE ]]; then
  say "the redis-cell module is missing; building it with scripts/test.sh --setup-only"
  bash scripts/test.sh --setup-only
fi

# tower-rate-limiter 0.2.0-alpha.0 declares rust-version 1.96; it builds on older toolchains, so the
# load-test crate (and only it) is built with --ignore-rust-version.
say "building loadtest/ (release)"
(cd loadtest && CARGO_TARGET_DIR=$ROOT/target cargo build --release --locked --ignore-rust-version -q) ||
  die "cargo build of loadtest/ failed"
BIN=$ROOT/target/release/loadtest-server

ALL=(
  bare
  throttle-mem-pass
  throttle-mem-deny
  governor-pass
  governor-deny
  throttle-lua-pass
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
  VARIANTS=(bare "$@")
else
  VARIANTS=("${ALL[@]}")
fi

TMP=$(mktemp -d)
REDIS_PID=
SERVER_PID=
cleanup() {
  [[ -n $SERVER_PID ]] && kill "$SERVER_PID" 2>/dev/null && wait "$SERVER_PID" 2>/dev/null
  [[ -n $REDIS_PID ]] && kill "$REDIS_PID" 2>/dev/null && wait "$REDIS_PID" 2>/dev/null
  rm -rf "$TMP"
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

# run VARIANT -> "rps total non2xx"
run() {
  local variant=$1 port out
  redis-cli -p "$RPORT" FLUSHALL >/dev/null
  local attempt
  for attempt in 1 2 3; do
    port=$(free_port)
    taskset -c "$SERVER_CPU" "$BIN" "$variant" --listen "127.0.0.1:$port" --redis "$REDIS_URL" \
      >"$TMP/server.log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 100); do
      curl -s -o /dev/null "http://127.0.0.1:$port/" && break
      kill -0 "$SERVER_PID" 2>/dev/null || break
      sleep 0.1
    done
    # A port taken between the check and the bind: try another one.
    kill -0 "$SERVER_PID" 2>/dev/null && break
    wait "$SERVER_PID" 2>/dev/null || true
    say "$variant exited at start (attempt $attempt): $(grep -m1 -v '^ ' "$TMP/server.log" || true)"
  done
  # Exhaust "deny" quotas (1 an hour) before measuring; the first request above did it already.
  curl -s -o /dev/null "http://127.0.0.1:$port/" || {
    cat "$TMP/server.log" >&2
    die "$variant did not start"
  }
  out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" "http://127.0.0.1:$port/")
  kill "$SERVER_PID" 2>/dev/null
  wait "$SERVER_PID" 2>/dev/null || true
  SERVER_PID=
  local rps total non2xx
  rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$out")
  total=$(awk '/requests in/ {print $1}' <<<"$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' <<<"$out")
  echo "$rps ${total:-0} ${non2xx:-0}"
}

declare -A BEST TOTAL NON2XX
for round in $(seq "$ROUNDS"); do
  for v in "${VARIANTS[@]}"; do
    run "$v" >"$TMP/result"
    read -r rps total non2xx <"$TMP/result"
    say "round $round: $v $rps req/s ($non2xx of $total not 200)"
    if [[ -z ${BEST[$v]:-} ]] || awk -v a="$rps" -v b="${BEST[$v]}" 'BEGIN {exit !(a > b)}'; then
      BEST[$v]=$rps
      TOTAL[$v]=$total
      NON2XX[$v]=$non2xx
    fi
  done
done

bare=${BEST[bare]}
printf '\n%s, %s cores, %s; wrk -t1 -c%s -d%ss, best of %s rounds\n\n' \
  "$(uname -m)" "$(nproc)" "$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')" \
  "$CONNECTIONS" "$DURATION" "$ROUNDS"
printf '| variant | requests/s | × bare | 200 | 429 (non-2xx) |\n|---|---:|---:|---:|---:|\n'
for v in "${VARIANTS[@]}"; do
  awk -v v="$v" -v r="${BEST[$v]}" -v b="$bare" -v t="${TOTAL[$v]}" -v n="${NON2XX[$v]}" \
    'BEGIN { printf "| %s | %.0f | %.3f | %.1f%% | %.1f%% |\n", v, r, r / b, 100 * (t - n) / t, 100 * n / t }'
done
