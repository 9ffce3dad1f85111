#!/usr/bin/env bash
# Instructions per request of loadtest/'s servers (callgrind), which the machine's load does not
# change: each variant's server runs under `valgrind --tool=callgrind` with instrumentation off,
# takes WARMUP requests, then counts over exactly N requests (CONNECTIONS keep-alive connections)
# and dumps. Prints each variant's user-space instructions per request (the server
# process: hyper, axum, the limiter; not the kernel) and its TOP functions by own instructions per
# request; the `bare` row is what the limiters add to.
#
#   bash scripts/profile_pass.sh                                   # bare throttle-mem-pass governor-pass
#   N=20000 TOP=25 bash scripts/profile_pass.sh bare throttle-mem-pass-noheaders
#   BIN=/tmp/base-server bash scripts/profile_pass.sh throttle-mem-pass   # another build of the server
#   AT=ef42591 bash scripts/profile_pass.sh throttle-mem-pass   # that commit's server, built side by
#       # side (kept in target/profile-at/); run again without AT for this tree's
#   FILES=1 N=2000 TOP=0 bash scripts/profile_pass.sh throttle-mem-pass throttle-mem-deny
#       # also the files of src/ each request runs code of (scripts/request_files.py), from a
#       # build with line tables (target/lines/; the counts differ a little from the default build)
#   CALLGRIND_EXTRA=--dump-instr=yes BIN=... bash scripts/profile_pass.sh throttle-mem-pass
#       # more callgrind options (per instruction: which memcpy call sites run, for objdump)
#
# The Redis variants (throttle-cell-pass, redis-cell-peer-pass, ...) need REDIS_URL (a redis-server
# with redis-cell loaded; REDIS_TIMEOUT_MS=5000 for the slow run); their counts are the server's own
# work, not Redis's, printed with the round trips to Redis (a coalesced variant's batches).
#
# Needs valgrind (Debian: apt-get install valgrind). The N requests are sent by oha (`-n N`) when it
# is installed (on PATH or in target/tools/oha, where scripts/loadgen.sh puts it), else by python3's
# http.client over CONNECTIONS keep-alive connections: only their number matters here, not their
# rate (wrk cannot bound it). The callgrind files stay in target/profile/ for callgrind_annotate.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
N=${N:-20000}
WARMUP=${WARMUP:-2000}
CONNECTIONS=${CONNECTIONS:-8}
TOP=${TOP:-15}
OUT=$ROOT/target/profile
say() { printf 'profile_pass.sh: %s\n' "$*" >&2; }
command -v valgrind >/dev/null 2>&1 || { say "needs valgrind (Debian: apt-get install valgrind)"; exit 1; }
OHA=$(command -v oha || echo "$ROOT/target/tools/oha/bin/oha")
if [[ -z ${BIN:-} && -n ${AT:-} ]]; then
  # Another commit's server, built side by side: its tree in a worktree, into a target dir of its
  # own (target/profile-at/target: its dependencies are built once there, and this tree's
  # target/release/loadtest-server is never the other commit's), the binary kept as
  # target/profile-at/<commit>.
  commit=$(git rev-parse --short "$AT")
  BIN=$ROOT/target/profile-at/$commit
  if [[ ! -x $BIN ]]; then
    say "building loadtest/ of $commit (release, in target/profile-at/tree)"
    rm -rf "$ROOT/target/profile-at/tree" && git worktree prune
    git worktree add -f --detach "$ROOT/target/profile-at/tree" "$commit" >/dev/null 2>&1
    (cd "$ROOT/target/profile-at/tree/loadtest" && CARGO_TARGET_DIR=$ROOT/target/profile-at/target \
      cargo build --release --locked --ignore-rust-version -q --bin loadtest-server)
    cp "$ROOT/target/profile-at/target/release/loadtest-server" "$BIN"
    rm -rf "$ROOT/target/profile-at/tree" && git worktree prune
  fi
elif [[ -z ${BIN:-} && -n ${FILES:-} ]]; then
  say "building loadtest/ (release, with line tables)"
  (cd loadtest && CARGO_PROFILE_RELEASE_DEBUG=line-tables-only CARGO_TARGET_DIR=$ROOT/target/lines \
    cargo build --release --locked --ignore-rust-version -q --bin loadtest-server)
  BIN=$ROOT/target/lines/release/loadtest-server
elif [[ -z ${BIN:-} ]]; then
  say "building loadtest/ (release)"
  (cd loadtest && CARGO_TARGET_DIR=$ROOT/target cargo build --release --locked --ignore-rust-version -q)
  BIN=$ROOT/target/release/loadtest-server
fi
(($#)) && VARIANTS=("$@") || VARIANTS=(bare throttle-mem-pass governor-pass)
mkdir -p "$OUT"

SERVER=
cleanup() { [[ -n $SERVER ]] && kill "$SERVER" 2>/dev/null || true; }
trap cleanup EXIT

# control PID ARGS...: a callgrind_control command. Callgrind reads commands when the program runs, and
# an idle server sleeps in epoll_wait, so a request wakes it.
control() {
  local pid=$1
  shift
  callgrind_control "$@" "$pid" >/dev/null &
  local ctl=$!
  for _ in $(seq 50); do
    kill -0 "$ctl" 2>/dev/null || break
    curl -s -o /dev/null "http://127.0.0.1:$PORT/" || true
    sleep 0.2
  done
  wait "$ctl"
}

# load COUNT: sends COUNT requests; prints "answered {status: count}".
load() {
  if [[ -x $OHA ]]; then
    taskset -c 1 "$OHA" --no-tui --output-format json -n "$1" -c "$CONNECTIONS" "http://127.0.0.1:$PORT/" |
      python3 -c 'import json, sys; r = json.load(sys.stdin)["statusCodeDistribution"]; print(sum(r.values()), r)'
  else
    python3 - "$PORT" "$1" "$CONNECTIONS" <<'PY'
import collections, http.client, sys, threading
port, count, connections = (int(a) for a in sys.argv[1:])
statuses, lock = collections.Counter(), threading.Lock()
def run(n):
    conn, mine = http.client.HTTPConnection("127.0.0.1", port), collections.Counter()
    for _ in range(n):
        conn.request("GET", "/")
        r = conn.getresponse()
        r.read()
        mine[r.status] += 1
    with lock:
        statuses.update(mine)
ts = [threading.Thread(target=run, args=(count // connections + (i < count % connections),)) for i in range(connections)]
[t.start() for t in ts]
[t.join() for t in ts]
print(sum(statuses.values()), dict(statuses))
PY
  fi
}

for v in "${VARIANTS[@]}"; do
  PORT=$((20000 + RANDOM % 12000))
  file=$OUT/callgrind.$v
  rm -f "$file" "$file".[0-9]*
  taskset -c 0 valgrind --tool=callgrind ${CALLGRIND_EXTRA:-} --instr-atstart=no --callgrind-out-file="$file" \
    "$BIN" "$v" --listen "127.0.0.1:$PORT" ${REDIS_URL:+--redis "$REDIS_URL"} >"$OUT/$v.log" 2>&1 &
  SERVER=$!
  for _ in $(seq 300); do curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.1; done
  load "$WARMUP" >/dev/null
  control "$SERVER" --instr=on
  control "$SERVER" --zero
  read -r answered statuses <<<"$(load "$N")"
  control "$SERVER" --dump
  kill "$SERVER"
  wait "$SERVER" 2>/dev/null || true
  SERVER=
  # The first dump (part 1) holds the N requests plus the one or two that woke the server for the
  # dump command; the file written at exit holds what came after.
  dump=$file.1
  total=$(callgrind_annotate "$dump" 2>/dev/null | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  # The client is named: oha's and python's requests cost the server different instructions, so
  # two counts compare only when one client sent both.
  client=python; [[ -x $OHA ]] && client=oha
  printf '%s: %s instructions per request (%s requests answered %s, sent by %s)\n' "$v" \
    "$(awk -v t="$total" -v n="$N" 'BEGIN {printf "%.0f", t / n}')" "$answered" "$statuses" "$client"
  callgrind_annotate --threshold=100 "$dump" 2>/dev/null |
    awk -v n="$N" -v top="$TOP" '/file:function/ {table = 1; next} table && /^ *[0-9,]+ / && shown < top {
      x = $1; gsub(",", "", x); $1 = ""; printf "  %8.0f %s\n", x / n, substr($0, 1, 150); shown++ }'
  if [[ -n ${FILES:-} ]]; then python3 scripts/request_files.py "$dump" "$N" "$ROOT/src"; fi
  # A coalesced variant's count moves with the batches its run happened to make (a batch costs
  # thousands of instructions): the round trips to Redis (calls of the connection's
  # req_packed_command(s)) say how many, so that two runs compare at their batch sizes.
  if [[ -n ${REDIS_URL:-} ]]; then
    python3 - "$dump" "$N" <<'PY'
import re, sys
names, callee, trips = {}, None, 0
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"c?fn=\((\d+)\)(?: (.*))?$", line)
    if m:
        if m.group(2):
            names[m.group(1)] = m.group(2)
        callee = m.group(1) if line.startswith("cfn=") else None
    elif line.startswith("calls=") and callee is not None:
        if "RedisConnection as redis::aio::ConnectionLike>::req_packed_command" in names.get(callee, ""):
            trips += int(line.split()[0][6:])
n = int(sys.argv[2])
print(f"  Redis round trips: {trips} ({trips / n:.3f} a request, {n / max(trips, 1):.1f} requests a trip)")
PY
  fi
done
