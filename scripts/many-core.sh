#!/usr/bin/env bash
# The many-core measurements in one command, for a machine that has many cores but no cargo (such as
# the project's lent 16-core machine): the scaling bench (benches/scaling.rs) and the end-to-end pairs
# of scripts/loadtest.sh with WORKERS tokio workers, from release binaries prepared here.
#
#   bash scripts/many-core.sh --pack DIR [LABEL]   # here: build; copy the binaries, wrk and its libraries
#   bash scripts/many-core.sh DIR                  # there: run every pack in DIR; tables on stdout
#
# --pack puts this checkout's scaling bench and loadtest-server into DIR as scaling-LABEL and
# loadtest-server-LABEL (LABEL defaults to the commit), so one DIR can hold two builds measured in one
# run (before and after a change: every bench and pair runs for each build in turn).
#
# Settings for the run (environment): SCALING_THREADS, SCALING_ROUNDS (default 2), SCALING_SECS
# (default 0.5), SCALING_CASES as the bench takes them; WORKERS (default 8), ROUNDS (default 3),
# DURATION (default 2) and VARIANTS (default: the memory paths with their tower_governor peers) for
# the HTTP pairs; SKIP_HTTP=1, SKIP_SCALING=1 or SKIP_TESTS=1 to leave one out. Logs go to $OUT
# when it is set. The memory backend's exact-count tests under contention (tests/memory, the ones
# named "contention") run first, on every core.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

say() { printf 'many-core.sh: %s\n' "$*" >&2; }
die() {
  say "error: $*"
  exit 1
}

if [[ ${1:-} == --pack ]]; then
  DIR=${2:?--pack DIR [LABEL]}
  LABEL=${3:-$(git rev-parse --short HEAD)}
  mkdir -p "$DIR/lib"
  # executable TARGET CARGO-ARGS...: builds with cargo (--no-run) and prints TARGET's executable.
  executable() {
    local target=$1 path
    shift
    path=$(cargo "$@" --no-run --message-format=json 2>/dev/null | TARGET=$target python3 -c 'import json, os, sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == os.environ["TARGET"] and m.get("executable"):
        print(m["executable"])')
    [[ -x $path ]] || die "cargo $* --no-run built no executable $target"
    echo "$path"
  }
  cp "$(executable scaling bench --bench scaling)" "$DIR/scaling-$LABEL"
  # The memory backend's exact-count tests under contention, to run where the threads really race.
  cp "$(executable memory test --release --all-features --test memory)" "$DIR/memory-tests-$LABEL"
  (cd loadtest && CARGO_TARGET_DIR=$ROOT/target cargo build --release --locked --ignore-rust-version -q) ||
    die "cargo build of loadtest/ failed"
  cp target/release/loadtest-server "$DIR/loadtest-server-$LABEL"
  if wrk=$(command -v wrk); then
    cp "$wrk" "$DIR/wrk"
    # Its libraries beyond the C library's own (LuaJIT, OpenSSL), in case the other machine lacks them.
    ldd "$wrk" | awk '$3 ~ /^\// {print $3}' | grep -v -E '/(libc|libm|libpthread|libdl|libgcc_s|ld-linux)[.-]' |
      xargs -r -I{} cp -L {} "$DIR/lib/"
  else
    say "wrk is not installed here (apt-get install wrk); the HTTP pairs will need it there"
  fi
  say "packed $LABEL into $DIR: $(ls "$DIR" | tr '\n' ' ')"
  exit 0
fi

DIR=$(cd "${1:?DIR (or --pack DIR [LABEL])}" && pwd)
LOG=${OUT:-$DIR/out}
mkdir -p "$LOG"
# The packed wrk, with its libraries (and only it: the machine's own programs keep theirs).
if [[ -x $DIR/wrk ]]; then
  WRAP=$(mktemp -d)
  printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib exec %s/wrk "$@"\n' "$DIR" "$DIR" >"$WRAP/wrk"
  chmod +x "$WRAP/wrk"
  export PATH=$WRAP:$PATH
fi
mapfile -t LABELS < <(cd "$DIR" && ls scaling-* loadtest-server-* 2>/dev/null | sed -E 's/^(scaling|loadtest-server)-//' | sort -u)
((${#LABELS[@]})) || die "no scaling-* or loadtest-server-* binary in $DIR (bash scripts/many-core.sh --pack $DIR)"
say "$(nproc) cores; builds: ${LABELS[*]}"

if [[ -z ${SKIP_TESTS:-} ]]; then
  for label in "${LABELS[@]}"; do
    [[ -x $DIR/memory-tests-$label ]] || continue
    say "exact counts under contention, build $label"
    "$DIR/memory-tests-$label" contention 2>&1 | tee "$LOG/contention-$label.log" | grep -E '^test |test result'
  done
fi

if [[ -z ${SKIP_SCALING:-} ]]; then
  export SCALING_ROUNDS=${SCALING_ROUNDS:-2} SCALING_SECS=${SCALING_SECS:-0.5}
  for label in "${LABELS[@]}"; do
    [[ -x $DIR/scaling-$label ]] || continue
    say "scaling bench, build $label"
    "$DIR/scaling-$label" --bench | tee "$LOG/scaling-$label.md"
  done
fi

if [[ -z ${SKIP_HTTP:-} ]]; then
  read -r -a VARIANTS <<<"${VARIANTS:-throttle-mem-pass governor-headers-pass throttle-mem-pass-noheaders governor-pass throttle-axumbody-pass throttle-axumbody-pass-noheaders throttle-mem-deny governor-deny}"
  for label in "${LABELS[@]}"; do
    server=$DIR/loadtest-server-$label
    [[ -x $server ]] || continue
    # The variants this build has (an older one may lack the newer ones).
    known=$("$server" --list)
    mine=()
    for v in "${VARIANTS[@]}"; do grep -qx -- "$v" <<<"$known" && mine+=("$v"); done
    say "HTTP pairs, build $label: ${mine[*]}"
    WORKERS=${WORKERS:-8} ROUNDS=${ROUNDS:-3} DURATION=${DURATION:-2} LOADTEST_BIN=$server \
      CSV=$LOG/loadtest-$label.csv bash scripts/loadtest.sh "${mine[@]}" 2>"$LOG/loadtest-$label.log" |
      tee "$LOG/loadtest-$label.md"
  done
fi
