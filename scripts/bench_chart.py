"""Draws scripts/loadtest.sh's table as a chart, beside BENCHMARKS.md.

    bash scripts/loadtest.sh && python3 scripts/bench_chart.py     # the run and its chart
    python3 scripts/bench_chart.py [--csv target/loadtest/results.csv] [--out benchmarks/loadtest]

Reads the CSV that scripts/loadtest.sh writes (a `#` caption line, then one row per variant), copies
it to OUT.csv and draws OUT.png: one horizontal bar per variant, the median of its paired ratios to
bare axum, with a line over the range of the pairs (min to max); tower-throttle's variants in one
colour, its peers (tower_governor, tower-redis-cell, tower-rate-limiter, the hand-written
middleware) in another, bare in grey, and a line at 1.0 (bare).

Needs matplotlib. When python3 cannot import it, the script makes a venv under target/chart-venv,
installs matplotlib there from PyPI (pip) and runs itself again with that venv's python.
"""

import argparse
import csv
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(ROOT, "target", "chart-venv")
COLOURS = {"tower-throttle": "#1f77b4", "peer": "#ff7f0e", "bare": "#9e9e9e"}
# A pair's ratio can be far off when the machine is busy (a bare round slowed by other work); the
# axis stops here and longer ranges are marked with their value.
MAX_AXIS = 2.0


def ensure_matplotlib():
    """Imports matplotlib, or re-runs this script with a venv's python that has it."""
    try:
        import matplotlib  # noqa: F401

        return
    except ImportError:
        pass
    python = os.path.join(VENV, "bin", "python3")
    if os.path.abspath(sys.executable) == os.path.abspath(python):
        sys.exit("bench_chart.py: matplotlib is still missing in " + VENV)
    if not os.path.exists(python):
        print("bench_chart.py: making " + VENV + " (python3 -m venv) for matplotlib", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    if subprocess.run([python, "-c", "import matplotlib"], stderr=subprocess.DEVNULL).returncode:
        print("bench_chart.py: pip install matplotlib into " + VENV, file=sys.stderr)
        subprocess.run([python, "-m", "pip", "install", "-q", "matplotlib"], check=True)
    os.execv(python, [python, os.path.abspath(__file__)] + sys.argv[1:])


def read_table(path):
    """Returns (caption, rows) of the CSV scripts/loadtest.sh writes."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    caption = " ".join(line.lstrip("# ").strip() for line in lines if line.startswith("#"))
    rows = list(csv.DictReader(line for line in lines if line and not line.startswith("#")))
    if not rows:
        sys.exit("bench_chart.py: no rows in " + path)
    for row in rows:
        for field in ("ratio_median", "ratio_min", "ratio_max"):
            row[field] = float(row[field])
    return caption, rows


def draw(caption, rows, png):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    n = len(rows)
    fig, ax = plt.subplots(figsize=(9, 1.6 + 0.32 * n), layout="constrained")
    ys = list(range(n))[::-1]  # the CSV's first row at the top
    top = min(MAX_AXIS, max(1.1, max(r["ratio_max"] for r in rows) * 1.08))
    for y, row in zip(ys, rows):
        median, lo, hi = row["ratio_median"], row["ratio_min"], row["ratio_max"]
        ax.barh(y, min(median, top), color=COLOURS.get(row["kind"], "#555555"), height=0.7)
        if row["kind"] != "bare":
            ax.plot([lo, min(hi, top)], [y, y], color="black", linewidth=1)
            ax.plot([lo, lo], [y - 0.18, y + 0.18], color="black", linewidth=1)
            if hi <= top:
                ax.plot([hi, hi], [y - 0.18, y + 0.18], color="black", linewidth=1)
            else:
                ax.annotate("max %.2f" % hi, (top, y), xytext=(-4, 0), textcoords="offset points",
                            ha="right", va="center", fontsize=7,
                            bbox=dict(facecolor="white", edgecolor="none", pad=1))
        label = "%.2f" % median
        ax.annotate(label, (0, y), xytext=(3, 0), textcoords="offset points", ha="left",
                    va="center", fontsize=7, color="white", fontweight="bold")
    ax.axvline(1.0, color="black", linestyle="--", linewidth=0.8)
    ax.set_yticks(ys)
    ax.set_yticklabels([r["variant"] for r in rows], fontsize=8)
    ax.set_xlim(0, top)
    ax.set_ylim(-0.6, n - 0.4)
    ax.set_xlabel("requests/s × bare axum (median of paired rounds; line: min to max)")
    fig.legend(handles=[Patch(color=COLOURS["tower-throttle"], label="tower-throttle"),
                        Patch(color=COLOURS["peer"], label="peers"),
                        Patch(color=COLOURS["bare"], label="bare")],
               loc="outside lower center", ncol=3, fontsize=8, frameon=False)
    ax.set_title(caption, fontsize=7, wrap=True)
    ax.grid(axis="x", linewidth=0.3)
    fig.savefig(png, dpi=110)
    plt.close(fig)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--csv", default=os.path.join(ROOT, "target", "loadtest", "results.csv"),
                        help="scripts/loadtest.sh's CSV (default: %(default)s)")
    parser.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "loadtest"),
                        help="writes OUT.csv (a copy) and OUT.png (default: %(default)s)")
    args = parser.parse_args()
    if not os.path.exists(args.csv):
        sys.exit("bench_chart.py: %s is missing; run bash scripts/loadtest.sh first" % args.csv)
    ensure_matplotlib()
    caption, rows = read_table(args.csv)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    if os.path.abspath(args.csv) != os.path.abspath(args.out + ".csv"):
        shutil.copyfile(args.csv, args.out + ".csv")
    draw(caption, rows, args.out + ".png")
    print("bench_chart.py: wrote %s.csv and %s.png" % (args.out, args.out))


if __name__ == "__main__":
    main()
