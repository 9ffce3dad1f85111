# Per-primary latency of the example server while a Redis Cluster primary dies, from the responses
# scripts/http_load.sh (wrk) wrote to its CSV (cluster_failover_trial.sh with P99=1).
#
#   python3 scripts/cluster_p99.py OUT.csv KILLED PROMOTED NODES
#       p50/p99/max per primary and phase: before the kill, from the kill to the replica's promotion
#       ("dying"), after it. NODES: `port=user-0,user-3 port=...`; the primary killed is named first.
import sys


def pct(values, p):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * p))]


def report(path, killed, promoted, nodes):
    owner = {}
    order = []
    for spec in nodes:
        port, users = spec.split("=")
        order.append(port)
        for u in users.split(","):
            owner[u] = port
    start = None
    samples = {}
    with open(path) as f:
        for line in f:
            t, user, ms, st = line.rstrip("\n").split(",")
            t, ms = float(t), float(ms)
            start = t if start is None else min(start, t)
            phase = "before" if t < killed else ("dying" if t < promoted else "after")
            key = (owner.get(user, "?"), phase)
            ok = st in ("200", "429")
            samples.setdefault(key, []).append((t, ms, ok))
    print(f"{'primary':>16} {'phase':>7} {'n':>7} {'failed':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    figures = {}
    for i, port in enumerate(order):
        for phase in ("before", "dying", "after"):
            rows = samples.get((port, phase), [])
            # The first second of load warms connections up: left out.
            rows = [r for r in rows if r[0] >= start + 1.0]
            lat = [ms for _, ms, _ in rows]
            failed = sum(1 for _, _, ok in rows if not ok)
            figures[(port, phase)] = pct(lat, 0.99)
            name = port + (" (killed)" if i == 0 else "")
            print(f"{name:>16} {phase:>7} {len(rows):>7} {failed:>7} {pct(lat, 0.5):>8.2f} "
                  f"{pct(lat, 0.99):>8.2f} {max(lat) if lat else float('nan'):>8.2f}")
    healthy = order[1:]
    ratios = [figures[(p, "dying")] / figures[(p, "before")] for p in healthy
              if figures[(p, "before")] == figures[(p, "before")] and figures[(p, "before")] > 0]
    print("healthy primaries' p99 dying/before: " + ", ".join(f"{r:.2f}x" for r in ratios))


if __name__ == "__main__":
    report(sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), sys.argv[4:])
