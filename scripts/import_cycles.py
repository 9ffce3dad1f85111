#!/usr/bin/env python3
"""Keep the shape of src/: no import circles, no long files without a reason.

Reads every src/**/*.rs, drops comments, string contents and `#[cfg(test)]` items, and collects
the modules each file refers to: `use crate::…`, `use super::…`, `use self::…`, a child module's
name (`use check::…`, `check::f()`), and the same paths written inline in code
(`crate::policy::Policy::builder`). One file is one module (inline `mod x { … }` blocks belong to
their file); a path resolves to the deepest module file it names, so `crate::policy::Policy` is
`policy.rs` and `crate::Policy` (a re-export at the root) is `lib.rs` — which is why code inside
the crate imports a name from the module that defines it.

Reports, and exits non-zero on any of:
  * every import against the layer rules (LAYER_RULES below): a module of a lower layer that
    imports one above it, such as the decision engine (engine/) importing tower's skeleton
    (middleware/), or the Redis backend importing a policy or the engine — even when no circle
    closes yet;
  * every import circle: each strongly connected component of the module graph with more than
    one file, with one import (file:line) per edge of a circle through it;
  * every file with more than 500 code lines (non-blank, non-comment, outside `#[cfg(test)]`)
    whose opening `//!` comment does not say why in a line containing "over 500 lines"
    (for example `//! Over 500 lines: the one table of every TOML key.`).

Usage: python3 scripts/import_cycles.py [--graph] [SRC_DIR]   (SRC_DIR defaults to ./src)
"""

import os
import re
import sys

LIMIT = 500

# The layers, as (modules, what they may not import): a module is named by its path from src/
# (`engine::steps`), a rule's module covers its children, and "crate" is lib.rs, the top. The
# order, bottom to top: the pure algorithms and keys; backend/ (with backend/redis/); policy/;
# engine/ (the decisions); handle.rs; middleware/ (tower's skeleton); config/; lib.rs. A feature
# folder sits where its parts do: rollout/ and meter/ below the engine but for the engine's part
# of rollout (rollout::shadows), and failure/ below the backend's users but for the engine's part
# of the failure policy (failure::verdict); overrides/ (what an operator changes at run time) above backend/
# (whose records keep them) and below policy/ and the engine (which read them).
ABOVE_BACKEND = ("policy", "per_customer", "rollout", "meter", "overrides", "engine", "handle", "middleware", "config", "crate")
LAYER_RULES = [
    ("backend", ABOVE_BACKEND, ()),
    ("overrides", ("policy", "per_customer", "engine", "handle", "middleware", "config", "crate"), ()),
    ("policy", ("engine", "handle", "middleware", "config", "crate"), ()),
    ("rollout", ("engine", "handle", "middleware", "config", "crate"), ("rollout::shadows",)),
    ("meter", ("engine", "handle", "middleware", "config", "crate"), ()),
    ("rollout::shadows", ("handle", "middleware", "config", "crate"), ()),
    ("failure", ABOVE_BACKEND, ("failure::verdict",)),
    ("failure::verdict", ("handle", "middleware", "config", "crate"), ()),
    ("engine", ("handle", "middleware", "config", "crate"), ()),
    ("handle", ("middleware", "config", "crate"), ()),
    ("middleware", ("config", "crate"), ()),
]
REASON = re.compile(r"over\s+500\s+(code\s+)?lines", re.IGNORECASE)
CFG_TEST = re.compile(r"#\[cfg\((?:all\()?\s*test\b[^\]]*\]")


def strip(text):
    """Comments removed and string/char contents blanked; newlines kept so lines still count."""
    out = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
            continue
        if text.startswith("/*", i):
            depth, j = 1, i + 2
            while j < n and depth:
                if text.startswith("/*", j):
                    depth, j = depth + 1, j + 2
                elif text.startswith("*/", j):
                    depth, j = depth - 1, j + 2
                else:
                    j += 1
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
            continue
        m = re.match(r'b?r(#*)"', text[i:i + 40]) if c in "rb" and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")) else None
        if m:
            close = '"' + m.group(1)
            start = i + m.end()
            j = text.find(close, start)
            j = n if j < 0 else j + len(close)
            out.append('""' + "".join("\n" for ch in text[start:j] if ch == "\n"))
            i = j
            continue
        if c == '"':
            j = i + 1
            while j < n and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            out.append('""' + "".join("\n" for ch in text[i:j] if ch == "\n"))
            i = j + 1
            continue
        if c == "'":
            # a char literal ('x', '\n', '\u{..}') or a lifetime ('a)
            if i + 1 < n and text[i + 1] == "\\":
                j = text.find("'", i + 2)
                out.append("' '")
                i = j + 1
                continue
            if i + 2 < n and text[i + 2] == "'":
                out.append("' '")
                i += 3
                continue
        out.append(c)
        i += 1
    return "".join(out)


def matching_brace(code, open_at):
    depth = 0
    for j in range(open_at, len(code)):
        if code[j] == "{":
            depth += 1
        elif code[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return len(code) - 1


def drop_test_items(code):
    """Blank every item under `#[cfg(test)]` (a braced item or one ending in `;`), keeping newlines."""
    while True:
        m = CFG_TEST.search(code)
        if not m:
            return code
        j = m.end()
        brace, semi = code.find("{", j), code.find(";", j)
        if brace >= 0 and (semi < 0 or brace < semi):
            end = matching_brace(code, brace)
        else:
            end = semi if semi >= 0 else len(code) - 1
        code = code[: m.start()] + "".join(ch if ch == "\n" else " " for ch in code[m.start(): end + 1]) + code[end + 1:]


def module_of(path, src):
    rel = os.path.relpath(path, src)[: -len(".rs")].split(os.sep)
    if rel == ["lib"] or rel == ["main"]:
        return ()
    if rel[-1] == "mod":
        rel = rel[:-1]
    return tuple(rel)


def expand_use_tree(tree):
    """`a::{b, c::{d, e}}` -> [a::b, a::c::d, a::c::e] (segments as lists)."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))
    results = []

    def walk(prefix, s):
        # split s on top-level commas
        parts, depth, cur = [], 0, ""
        for ch in s:
            if ch == "," and depth == 0:
                parts.append(cur)
                cur = ""
                continue
            depth += ch == "{"
            depth -= ch == "}"
            cur += ch
        parts.append(cur)
        for p in parts:
            if not p:
                continue
            brace = p.find("{")
            if brace >= 0:
                head = [x for x in p[:brace].split("::") if x]
                walk(prefix + head, p[brace + 1: p.rfind("}")])
            else:
                results.append(prefix + [x for x in p.split("::") if x])

    walk([], tree)
    return results


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    show_graph = "--graph" in sys.argv
    src = args[0] if args else "src"
    files = {}
    for root, _, names in os.walk(src):
        for name in names:
            if name.endswith(".rs"):
                path = os.path.join(root, name)
                files[module_of(path, src)] = path
    modules = set(files)

    edges = {}  # (from, to) -> "file:line"
    long_files = []
    for mod, path in sorted(files.items()):
        text = open(path, encoding="utf-8").read()
        code = drop_test_items(strip(text))
        lines = [ln for ln in code.split("\n") if ln.strip()]
        if len(lines) > LIMIT:
            opening = []
            for ln in text.split("\n"):
                if ln.startswith("//!"):
                    opening.append(ln)
                elif ln.strip() and not ln.startswith("#!"):
                    break
            if not any(REASON.search(ln) for ln in opening):
                long_files.append((path, len(lines)))

        # inline `mod x { … }` spans: `super` inside them stays in this file for one level
        inline = []
        for m in re.finditer(r"\bmod\s+(\w+)\s*\{", code):
            inline.append((m.end() - 1, matching_brace(code, m.end() - 1)))
        children = set(re.findall(r"\bmod\s+(\w+)\s*;", code))

        def line_of(pos):
            return code.count("\n", 0, pos) + 1

        def resolve(segs, pos):
            depth = sum(1 for a, b in inline if a < pos < b)
            if segs[0] == "crate":
                base, rest = (), segs[1:]
            elif segs[0] in ("super", "self"):
                base, rest = mod, segs
                while rest and rest[0] in ("super", "self"):
                    if rest[0] == "super":
                        if depth:
                            depth -= 1
                        else:
                            base = base[:-1]
                    rest = rest[1:]
                if depth:
                    return None  # inside an inline module: its own items
            elif segs[0] in children and not depth:
                base, rest = mod, segs
            else:
                return None
            target = base
            for s in rest:
                if target + (s,) in modules:
                    target = target + (s,)
                else:
                    break
            return target

        def add(segs, pos):
            target = resolve(segs, pos)
            if target is not None and target != mod and target in modules:
                edges.setdefault((mod, target), f"{path}:{line_of(pos)}")

        for m in re.finditer(r"\buse\s+([^;]+);", code):
            for segs in expand_use_tree(m.group(1)):
                if segs:
                    add(segs, m.start())
        stripped_uses = re.sub(r"\buse\s+[^;]+;", lambda m: " " * len(m.group(0)), code)
        for m in re.finditer(r"(?<![\w$:])((?:crate|super|self|[a-z_][a-z0-9_]*)(?:::[A-Za-z_]\w*)+)", stripped_uses):
            segs = m.group(1).split("::")
            if segs[0] in ("crate", "super", "self") or segs[0] in children:
                add(segs, m.start())

    graph = {m: set() for m in modules}
    for a, b in edges:
        graph[a].add(b)

    name = lambda m: "crate" if not m else "::".join(m)
    if show_graph:
        for a in sorted(graph):
            print(f"{name(a)} -> {', '.join(sorted(name(b) for b in graph[a]))}")

    # Tarjan's strongly connected components
    index, low, on, stack, sccs, counter = {}, {}, set(), [], [], [0]
    sys.setrecursionlimit(10000)

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)

    for comp in sccs:
        members = set(comp)
        print(f"import circle among {len(comp)} modules: {', '.join(name(m) for m in comp)}")
        for a in comp:
            for b in sorted(graph[a] & members):
                print(f"  {name(a)} -> {name(b)}   ({edges[(a, b)]})")
    def under(module, prefix):
        return module == prefix or module.startswith(prefix + "::")

    against = []
    for (a, b), where in sorted(edges.items()):
        src, dst = name(a), name(b)
        for scope, forbidden, exempt in LAYER_RULES:
            if under(src, scope) and not any(under(src, e) for e in exempt):
                if any(under(dst, f) for f in forbidden):
                    against.append(f"{src} -> {dst}   ({where}): {scope} may not import {dst}")
    for line in against:
        print(f"import against the layers: {line}")
    for path, count in long_files:
        print(f"{path}: {count} code lines (> {LIMIT}) and no 'over {LIMIT} lines' reason in its opening //! comment")
    if sccs or long_files or against:
        sys.exit(1)
    print(f"{len(modules)} modules, {len(edges)} imports between them: no import circle, none against the layers, no unexplained file over {LIMIT} code lines")


if __name__ == "__main__":
    main()
