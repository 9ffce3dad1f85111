#!/usr/bin/env bash
# Two builds of loadtest/'s server side by side (say, main's and a branch's), one variant, to tell
# whether a change made it slower:
#
#   (cd loadtest && cargo build --release --ignore-rust-version)   # in each checkout; copy the
#   BASE=/tmp/base-server NEW=/tmp/new-server ROUNDS=21 DURATION=2 \   # two loadtest-server binaries
#     bash scripts/loadtest-ab.sh throttle-mem-pass
#
# Each server runs on CPU 0 (one tokio thread), the load (wrk -t1 -c32, else oha: scripts/loadgen.sh)
# on CPU 1, as scripts/loadtest.sh runs them; rounds alternate which goes first. Per round:
# requests/s, and the server's own CPU time per request (utime+stime from /proc over the run, over the
# responses the load counted), which other work on the machine disturbs much less than requests/s.
# Prints the medians of the paired ratios new/base.
# Run the variant `bare` too: both builds serve it with the same code, so its ratios are the noise.
# WORKERS=N: N tokio workers per server on CPUs 0..N-1, the load (N wrk threads, 32 connections per
# worker) on CPUs N..2N-1, as in scripts/loadtest.sh.
# REDIS_URL=redis://127.0.0.1:6379/: a Redis variant (throttle-lua-pass, ...), both servers on that
# Redis (each keeps its keys under a prefix of its own: lt<pid>).
set -euo pipefail
ROUNDS=${ROUNDS:-21}; DURATION=${DURATION:-2}; VARIANT=${1:-throttle-mem-pass}
WORKERS=${WORKERS:-1}
[[ $WORKERS =~ ^[1-9][0-9]*$ ]] || { echo "loadtest-ab.sh: WORKERS must be a count of 1 or more" >&2; exit 2; }
if ((WORKERS == 1)); then SERVER_CPU=0 LOAD_CPU=1; else SERVER_CPU=0-$((WORKERS - 1)) LOAD_CPU=$WORKERS-$((2 * WORKERS - 1)); fi
export LOADGEN_THREADS=$WORKERS
# Only with more than one worker, so that a baseline built before --workers existed still runs.
WORKER_ARGS=(); ((WORKERS == 1)) || WORKER_ARGS=(--workers "$WORKERS")
[[ -z ${REDIS_URL:-} ]] || WORKER_ARGS+=(--redis "$REDIS_URL")
BASE=${BASE:?BASE=path of the baseline loadtest-server}; NEW=${NEW:?NEW=path of the new loadtest-server}
# shellcheck source=scripts/loadgen.sh
source "$(dirname "$0")/loadgen.sh"; loadgen_pick
TICK=$(getconf CLK_TCK)
free_port() { while :; do p=$((20000 + RANDOM % 12000)); (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null || { echo $p; return; }; done; }
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT
declare -A PORT SPID
start() { local name=$1 bin=$2 port; port=$(free_port)
  taskset -c "$SERVER_CPU" "$bin" "$VARIANT" --listen "127.0.0.1:$port" ${WORKER_ARGS[@]+"${WORKER_ARGS[@]}"} >/dev/null 2>&1 & PIDS+=($!); SPID[$name]=$!
  for _ in $(seq 100); do curl -s -o /dev/null "http://127.0.0.1:$port/" && break; sleep 0.1; done; PORT[$name]=$port; }
start base $BASE; start new $NEW
cpu() { awk '{print $14 + $15}' /proc/$1/stat; }
# measure NAME -> "rps cpu_us_per_request"
measure() { local c0 c1 rps total
  c0=$(cpu ${SPID[$1]})
  read -r rps total _ <<<"$(loadgen_run "$LOAD_CPU" $((32 * WORKERS)) "$DURATION" "http://127.0.0.1:${PORT[$1]}/")"
  c1=$(cpu ${SPID[$1]})
  echo "$rps $(awk -v d=$((c1 - c0)) -v t=$TICK -v n=$total 'BEGIN{printf "%.3f", d / t * 1e6 / n}')"; }
measure base >/dev/null; measure new >/dev/null
RR=(); CR=(); BC=(); NC=(); BR=(); NR_=()
for r in $(seq $ROUNDS); do
  if (( r % 2 )); then read -r br bc <<<"$(measure base)"; read -r nr nc <<<"$(measure new)"
  else read -r nr nc <<<"$(measure new)"; read -r br bc <<<"$(measure base)"; fi
  rr=$(awk -v a=$nr -v b=$br 'BEGIN{printf "%.3f", a/b}'); cr=$(awk -v a=$nc -v b=$bc 'BEGIN{printf "%.3f", a/b}')
  echo "round $r: base $br req/s $bc us/req; new $nr req/s $nc us/req; req/s new/base $rr, CPU/req new/base $cr"
  RR+=($rr); CR+=($cr); BC+=($bc); NC+=($nc); BR+=($br); NR_+=($nr)
done
med() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}'; }
echo "$VARIANT, $ROUNDS rounds of ${DURATION}s pairs: req/s median base $(med "${BR[@]}") new $(med "${NR_[@]}"), median paired ratio new/base $(med "${RR[@]}"); server CPU per request median base $(med "${BC[@]}") us new $(med "${NC[@]}") us, median paired ratio new/base $(med "${CR[@]}")"
