#!/usr/bin/env python3
"""What the lines of src/ are, and a budget on its code that CI holds.

Each line of src/**/*.rs and src/**/*.lua is one of:
  * code: anything left once comments and `#[cfg(test)]` items are dropped (as
    scripts/import_cycles.py reads a file);
  * tests: inside a `#[cfg(test)]` item, or in a file that its parent declares
    `#[cfg(test)] mod name;`;
  * docs: `///` and `//!` lines;
  * other: comments and blank lines.

`wc -l` counts all four; a feature's cost to maintain is its code. So the budget is on code:
`scripts/src_budget` names the most code lines src/ may hold, and the most the request's path
(src/middleware/ and src/engine/) may. A change that needs more raises the budget in the same
commit and says why in its message; one that makes src/ smaller lowers it, so the room it made is
not spent by the next one unseen.

Usage:
  python3 scripts/src_lines.py                  # the table: each folder of src/, and the total
  python3 scripts/src_lines.py --check          # exit 1 when over scripts/src_budget
  python3 scripts/src_lines.py --tree DIR ...   # another tree's src/ (`git archive C src | tar -x`)
"""

import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from import_cycles import drop_test_items, strip  # noqa: E402

KINDS = ("code", "tests", "docs", "other")
# `#[cfg(test)] mod name;`, `#[cfg(all(test, feature = ".."))]`, a `#[path = ".."]` either side.
TEST_MOD = re.compile(
    r"((?:#\[[^\]]*\]\s*)+)(?:pub(?:\([^)]*\))?\s+)?mod\s+(\w+)\s*;"
)
CFG_TEST = re.compile(r"#\[cfg\((?:all\()?\s*test\b")
PATH_ATTR = re.compile(r'#\[path\s*=\s*"([^"]+)"\]')
# The request's path: tower's skeleton and the decision engine.
PATH = ("middleware", "engine")


def test_files(src):
    """The files declared `#[cfg(test)] mod name;` by their parent."""
    found = set()
    for root, _, names in os.walk(src):
        for name in names:
            if not name.endswith(".rs"):
                continue
            path = os.path.normpath(os.path.join(root, name))
            stem = name[:-3]
            # Where a file's child modules live: beside it for lib.rs and mod.rs, else in its folder.
            home = root if stem in ("lib", "mod", "main") else os.path.join(root, stem)
            for m in TEST_MOD.finditer(open(path, encoding="utf-8").read()):
                attrs, module = m.groups()
                if not CFG_TEST.search(attrs):
                    continue
                named = PATH_ATTR.search(attrs)
                if named:
                    # `#[path]` is relative to the declaring file's folder.
                    found.add(os.path.normpath(os.path.join(root, named.group(1))))
                else:
                    found.add(os.path.normpath(os.path.join(home, module + ".rs")))
                    found.add(os.path.normpath(os.path.join(home, module, "mod.rs")))
    return found


def kinds_of(path, is_test):
    text = open(path, encoding="utf-8").read()
    raw = text.split("\n")
    if raw and raw[-1] == "":
        raw.pop()
    if path.endswith(".lua"):
        return [
            "other" if not ln.strip() or ln.strip().startswith("--") else "code" for ln in raw
        ]
    if is_test:
        return ["tests"] * len(raw)
    stripped = strip(text).split("\n")
    code = drop_test_items("\n".join(stripped)).split("\n")
    out = []
    for i, ln in enumerate(raw):
        s = ln.strip()
        if code[i].strip():
            out.append("code")
        elif stripped[i].strip():
            out.append("tests")
        elif s.startswith("///") or s.startswith("//!"):
            out.append("docs")
        else:
            out.append("other")
    return out


def count(src):
    """{folder of src/ (a top-level file is its own): {kind: lines}}"""
    tests = test_files(src)
    per = {}
    for root, _, names in os.walk(src):
        for name in names:
            if not name.endswith((".rs", ".lua")):
                continue
            path = os.path.normpath(os.path.join(root, name))
            rel = os.path.relpath(path, src).split(os.sep)
            part = rel[0] if len(rel) > 1 else rel[0]
            row = per.setdefault(part, dict.fromkeys(KINDS, 0))
            for kind in kinds_of(path, path in tests):
                row[kind] += 1
    return per


def read_budget(path):
    budget = {}
    for ln in open(path, encoding="utf-8"):
        ln = ln.split("#", 1)[0].split()
        if ln:
            budget[ln[0]] = int(ln[1])
    return budget


def main():
    args = sys.argv[1:]
    root = "."
    if "--tree" in args:
        root = args[args.index("--tree") + 1]
    src = os.path.join(root, "src")
    per = count(src)
    total = {k: sum(row[k] for row in per.values()) for k in KINDS}
    path = {k: sum(per.get(p, {}).get(k, 0) for p in PATH) for k in KINDS}
    if "--check" not in args:
        print(f"{'':24} {'all':>7} " + " ".join(f"{k:>7}" for k in KINDS))
        rows = sorted(per.items(), key=lambda r: -sum(r[1].values()))
        for name, row in rows + [("= src/", total), ("= middleware+engine", path)]:
            print(f"{name:24} {sum(row.values()):7} " + " ".join(f"{row[k]:7}" for k in KINDS))
        return 0
    budget = read_budget(os.path.join(os.path.dirname(os.path.abspath(__file__)), "src_budget"))
    over = []
    for name, have in (("code", total["code"]), ("path", path["code"])):
        most = budget[name]
        state = "over" if have > most else "within"
        print(f"src_lines.py: {name}: {have} code lines, budget {most} ({state})")
        if have > most:
            over.append(name)
    if over:
        print(
            "src_lines.py: over scripts/src_budget. Make the change smaller, or raise the budget in"
            " the same commit and say why in its message.",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
