# The load generator of scripts/loadtest.sh and scripts/loadtest-ab.sh (sourced by both, not run):
# wrk where the machine has it, else oha from crates.io, installed once by `cargo install oha
# --locked` into target/tools/oha (a path these scripts control) when neither is found. LOADGEN=oha
# picks oha even where wrk is installed (LOADGEN=wrk insists on wrk).
#
#   source scripts/loadgen.sh
#   loadgen_pick                               # sets LOADGEN (wrk | oha) and LOADGEN_BIN
#   loadgen_run CPU CONNECTIONS SECONDS URL    # prints "requests/s responses non-2xx"
#
# Both run a closed loop on CPU (`taskset -c CPU`: one core, or a list such as 8-15): CONNECTIONS
# keep-alive connections, each sending the next GET as soon as the answer to the last one is read,
# for SECONDS. wrk runs LOADGEN_THREADS threads (default 1: -t1); oha, a multi-threaded tokio
# client, runs on the cores it is pinned to. Requests/s
# counts completed responses only (oha's requests cut off at the deadline are not responses).

# loadgen_pick: sets LOADGEN and LOADGEN_BIN, installing oha when neither tool is found.
loadgen_pick() {
  local root
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  local oha_root=${OHA_ROOT:-$root/target/tools/oha}
  LOADGEN=${LOADGEN:-}
  if [[ -z $LOADGEN ]]; then
    if command -v wrk >/dev/null 2>&1; then LOADGEN=wrk; else LOADGEN=oha; fi
  fi
  case $LOADGEN in
    wrk)
      LOADGEN_BIN=$(command -v wrk) || {
        echo "loadgen.sh: LOADGEN=wrk but wrk is missing (Debian: apt-get install wrk)" >&2
        return 1
      }
      ;;
    oha)
      if command -v oha >/dev/null 2>&1; then
        LOADGEN_BIN=$(command -v oha)
      else
        LOADGEN_BIN=$oha_root/bin/oha
        if [[ ! -x $LOADGEN_BIN ]]; then
          echo "loadgen.sh: neither wrk nor oha found; cargo install oha --locked --root $oha_root" >&2
          cargo install oha --locked --root "$oha_root" -q || {
            echo "loadgen.sh: installing oha failed (or install wrk: apt-get install wrk)" >&2
            return 1
          }
        fi
      fi
      ;;
    *)
      echo "loadgen.sh: LOADGEN must be wrk or oha, not '$LOADGEN'" >&2
      return 1
      ;;
  esac
}

# loadgen_run CPU CONNECTIONS SECONDS URL: prints "requests/s responses non-2xx".
loadgen_run() {
  local cpu=$1 connections=$2 seconds=$3 url=$4 out
  if [[ $LOADGEN == wrk ]]; then
    out=$(taskset -c "$cpu" "$LOADGEN_BIN" -t"${LOADGEN_THREADS:-1}" -c"$connections" -d"${seconds}s" "$url")
    echo "$(awk '/^Requests\/sec:/ {print $2}' <<<"$out") $(awk '/requests in/ {print $1}' <<<"$out") $(
      awk '/Non-2xx or 3xx responses:/ {n = $5} END {print n + 0}' <<<"$out")"
  else
    out=$(taskset -c "$cpu" "$LOADGEN_BIN" --no-tui --output-format json -c "$connections" \
      -z "${seconds}s" "$url")
    python3 -c '
import json, sys
report = json.load(sys.stdin)
codes = {int(k): v for k, v in report["statusCodeDistribution"].items()}
responses = sum(codes.values())
non2xx = sum(v for k, v in codes.items() if not 200 <= k < 400)
print("%.2f %d %d" % (responses / report["summary"]["total"], responses, non2xx))
' <<<"$out"
  fi
}

# loadgen_describe CONNECTIONS SECONDS: the command line's load part, for the table's caption.
loadgen_describe() {
  if [[ $LOADGEN == wrk ]]; then echo "wrk -t${LOADGEN_THREADS:-1} -c$1 -d$2s"; else echo "oha -c $1 -z $2s"; fi
}
