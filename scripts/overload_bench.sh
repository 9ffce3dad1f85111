#!/usr/bin/env bash
# Issue 51, deliverable 6: the overload side-by-side, in one run. One bounded-capacity axum
# service (WORKERS workers, each request holding one for SERVICE_MS: capacity WORKERS/SERVICE_MS,
# a queue past it) served unprotected and behind each overload protection, every variant on its
# own port, then each driven by the same open-loop load: first at half the capacity (its unloaded
# latency), then at OVERLOAD × the capacity. Prints the table of benchmarks/overload-side-by-side.md.
#
#   bash scripts/overload_bench.sh                          # every variant, about 4 minutes
#   bash scripts/overload_bench.sh none throttle-gradient   # only these
#   SLOPE=1 bash scripts/overload_bench.sh                  # service time grows with busy workers
#   DROP_TO=4 bash scripts/overload_bench.sh                # 4 workers left in the overload's middle third
#   SUMMARY_ONLY=1 OUT=target/overload-bench bash scripts/overload_bench.sh   # the table again
#
# The servers and the load come from loadtest/'s overload-bench (src/overload.rs says how each is
# built), built in release. Servers run on CPU 0 and the load on CPU 1 (taskset), so the load
# generator does not steal the server's core. Per variant, the first WARMUP seconds of the overload
# phase are left out (an adaptive limit is still finding its level: the same cut for every one).
# Needs python3, curl and taskset.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
TARGET=${CARGO_TARGET_DIR:-$ROOT/target}

WORKERS=${WORKERS:-8}
SERVICE_MS=${SERVICE_MS:-10}
SLOPE=${SLOPE:-0}
LOW_SECONDS=${LOW_SECONDS:-8}
HIGH_SECONDS=${HIGH_SECONDS:-15}
WARMUP=${WARMUP:-2}
OVERLOAD=${OVERLOAD:-2}
# DROP_TO=M: the service has M workers in the middle third of the overload phase (the load stays
# at OVERLOAD × the full capacity), then WORKERS again.
DROP_TO=${DROP_TO:-}
CONNS=${CONNS:-256}
OUT=${OUT:-$TARGET/overload-bench}
# With SLOPE, the service time of N busy workers is SERVICE_MS × (1 + SLOPE): the most it serves.
CAPACITY=$(python3 -c "print(int($WORKERS * 1000 / ($SERVICE_MS * (1 + $SLOPE))))")

ALL=(none tower-static-n tower-static-2n resilience-vegas resilience-aimd resilience-aimd-20ms
  throttle-gradient throttle-aimd)
VARIANTS=("$@")
((${#VARIANTS[@]})) || VARIANTS=("${ALL[@]}")

say() { printf 'overload_bench.sh: %s\n' "$*" >&2; }

# SUMMARY_ONLY=1: print the table again from the files of an earlier run in $OUT.
if [[ ${SUMMARY_ONLY:-} != 1 ]]; then
  BIN=${OVERLOAD_BENCH_BIN:-}
  if [[ -z $BIN ]]; then
    (cd loadtest && CARGO_TARGET_DIR=$TARGET cargo build --release --locked --ignore-rust-version \
      --bin overload-bench -q)
    BIN=$TARGET/release/overload-bench
fi
rm -rf "$OUT" && mkdir -p "$OUT"

PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

# Every server starts before any load, so the run measures them all under the same conditions.
# Each binds a free port and prints it.
# The logs are appended to (O_APPEND), so the phase markers the script writes land between the
# server's lines rather than under them.
for v in "${VARIANTS[@]}"; do
  taskset -c 0 "$BIN" serve "$v" --workers "$WORKERS" --service-ms "$SERVICE_MS" \
    --slope "$SLOPE" >"$OUT/$v.port" 2>>"$OUT/$v.server.log" &
  PIDS+=($!)
done
declare -A PORT
for v in "${VARIANTS[@]}"; do
  for _ in $(seq 50); do
    PORT[$v]=$(head -n1 "$OUT/$v.port")
    [[ -n ${PORT[$v]} ]] && curl -sf -o /dev/null "http://127.0.0.1:${PORT[$v]}/" && break
    sleep 0.1
  done
  curl -sf -o /dev/null "http://127.0.0.1:${PORT[$v]}/" || {
    say "error: $v did not start: $(tail -n3 "$OUT/$v.server.log")"
    exit 1
  }
done

say "capacity $CAPACITY/s ($WORKERS workers × $SERVICE_MS ms, slope $SLOPE${DROP_TO:+, $DROP_TO workers in the middle third of the overload}); $CONNS connections"
for v in "${VARIANTS[@]}"; do
  url=http://127.0.0.1:${PORT[$v]}/
  echo "--- low" >>"$OUT/$v.server.log"
  taskset -c 1 "$BIN" load --url "$url" --rate $((CAPACITY / 2)) --conns "$CONNS" \
    --seconds "$LOW_SECONDS" --out "$OUT/$v.low.csv"
  echo "--- high" >>"$OUT/$v.server.log"
  if [[ -n $DROP_TO ]]; then
    third=$(python3 -c "print($HIGH_SECONDS / 3)")
    (sleep "$third" && curl -sf -o /dev/null "${url}capacity?workers=$DROP_TO" &&
      sleep "$third" && curl -sf -o /dev/null "${url}capacity?workers=$WORKERS") &
  fi
  taskset -c 1 "$BIN" load --url "$url" --rate $((CAPACITY * OVERLOAD)) --conns "$CONNS" \
    --seconds "$HIGH_SECONDS" --out "$OUT/$v.high.csv"
done

fi

DROP_TO=$DROP_TO WORKERS=$WORKERS \
python3 - "$OUT" "$CAPACITY" "$WARMUP" "$HIGH_SECONDS" "${VARIANTS[@]}" <<'EOF'
import os, sys

out, capacity, warmup, high = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
variants = sys.argv[5:]
low_capacity = capacity
if os.environ.get("DROP_TO"):
    # The nominal capacity over the window: the middle third of the phase at DROP_TO workers.
    third = high / 3
    share = float(os.environ["DROP_TO"]) / float(os.environ["WORKERS"])
    capacity = int(capacity * ((high - warmup - third) + share * third) / (high - warmup))


def read(path, skip):
    rows, head = [], ""
    for line in open(path):
        if line.startswith("#"):
            head = line.strip()
            continue
        at, status, us = line.split(",")
        if float(at) >= skip:
            rows.append((int(status), int(us) / 1000.0))
    return rows, head


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else float("nan")


low = {}
for v in variants:
    rows, _ = read(f"{out}/{v}.low.csv", 1.0)  # the first second: connections opening
    low[v] = pct([ms for s, ms in rows if 200 <= s < 300], 0.99)
# The service's unloaded p99: at half its capacity no protection acts, so every variant measures
# the same service, and the median of their p99s is steadier on a shared machine than any one
# 8-second sample (a single stall moves one variant's p99 by half).
base = sorted(low.values())[len(low) // 2]
deadline = 2 * base
window = high - warmup
res = {}
for v in variants:
    rows, head = read(f"{out}/{v}.high.csv", warmup)
    ok = [ms for s, ms in rows if 200 <= s < 300]
    shed = sum(1 for s, _ in rows if s in (429, 503))
    fields = head.split()
    offered = int(fields[2])
    unsent = int(fields[4])
    res[v] = dict(
        good=len(ok) / window,
        good_dl=sum(1 for ms in ok if ms <= deadline) / window,
        p50=pct(ok, 0.5),
        p99=pct(ok, 0.99),
        shed=shed / max(1, len(rows)),
        unsent=unsent / max(1, offered),
        other=sum(1 for s, _ in rows if not (200 <= s < 300 or s in (429, 503))),
    )
# What the service really serves (tokio's timer rounds each sleep up to the next millisecond): the
# unprotected service's goodput while overloaded, its workers never idle. The goal is judged
# against it; the nominal capacity is shown too.
served = res["none"]["good"] if "none" in res else capacity
print(f"\ncapacity {capacity}/s nominal, {served:.0f}/s measured (none, overloaded); unloaded p99 "
      f"{base:.1f} ms (median of the variants at {low_capacity // 2}/s); deadline {deadline:.1f} ms; window {window:.0f} s")
print("| variant | unloaded p99 ms | goodput/s | in deadline/s | p50 ms | p99 ms | shed | unsent "
      "| p99 / unloaded | goodput / nominal | goodput / measured | in deadline / measured | goal |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for v in variants:
    r = res[v]
    goal = r["p99"] <= 2 * base and r["good"] >= 0.9 * served
    print(f"| {v} | {low[v]:.1f} | {r['good']:.0f} | {r['good_dl']:.0f} | {r['p50']:.1f} "
          f"| {r['p99']:.1f} | {r['shed']:.0%} | {r['unsent']:.0%} | {r['p99'] / base:.2f} "
          f"| {r['good'] / capacity:.2f} | {r['good'] / served:.2f} | {r['good_dl'] / served:.2f} "
          f"| {'met' if goal else 'no'} |")
ours = [v for v in variants if v.startswith("throttle-")]
peers = [v for v in variants if not v.startswith("throttle-")]
if ours and peers:
    print("\nours against each peer: p99 ratio (below 1: ours faster) / in-deadline goodput ratio "
          "(above 1: ours more)")
    print("| peer | " + " | ".join(ours) + " |")
    print("|---|" + "---|" * len(ours))
    for p in peers:
        cells = [f"{res[o]['p99'] / res[p]['p99']:.2f} / "
                 + (f"{res[o]['good_dl'] / res[p]['good_dl']:.2f}" if res[p]["good_dl"] >= 1 else "inf")
                 for o in ours]
        print(f"| {p} | " + " | ".join(cells) + " |")
for v in variants:
    high_limits, in_high = [], False
    for line in open(f"{out}/{v}.server.log"):
        in_high = in_high or line.startswith("--- high")
        if in_high and line.startswith("limit "):
            high_limits.append(int(line.split()[1]))
    if high_limits:
        print(f"note: {v}: the gate's limit while overloaded: median {pct(high_limits, 0.5)}, "
              f"{min(high_limits)} to {max(high_limits)}")
    if res[v]["other"]:
        print(f"note: {v}: {res[v]['other']} answers neither 2xx nor a refusal")
EOF
