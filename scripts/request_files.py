#!/usr/bin/env python3
"""The files of src/ whose code a request runs, from a callgrind dump of a build with line tables
(`CARGO_PROFILE_RELEASE_DEBUG=line-tables-only`): each file's own instructions per request,
counting code inlined from it (callgrind's `fi=`/`fe=` records) as its own.

Usage: python3 scripts/request_files.py DUMP REQUESTS [SRC_ROOT]
Prints one line per file of SRC_ROOT (default: this checkout's src/) with at least one
instruction a request, then the count of the layer's files: those outside key/, backend/ and
the algorithms (gcra.rs, window.rs, calendar, clock.rs), which issue 49 counts.
"""
import os
import re
import sys

dump, requests = sys.argv[1], int(sys.argv[2])
root = os.path.abspath(sys.argv[3] if len(sys.argv) > 3 else os.path.join(os.path.dirname(__file__), "..", "src")) + "/"
names, own = {}, {}
current = None
skip_next = False
spec = re.compile(r"^(fl|fi|fe|cfi|cfl|cfn|fn|ob|cob)=\((\d+)\)(?: (.*))?$")
for line in open(dump, errors="replace"):
    line = line.rstrip("\n")
    m = spec.match(line)
    if m:
        kind, ident, name = m.groups()
        if kind in ("fl", "fi", "fe", "cfi", "cfl") and name is not None:
            names[ident] = name
        if kind in ("fl", "fi", "fe"):
            current = ident
        continue
    if line.startswith("calls="):
        skip_next = True
        continue
    if line and (line[0].isdigit() or line[0] in "+-*"):
        if skip_next:
            skip_next = False
            continue
        parts = line.split()
        if len(parts) >= 2 and current is not None:
            own[current] = own.get(current, 0) + int(parts[1])
aside = ("key/", "backend/", "gcra.rs", "window.rs", "calendar", "clock.rs")
layer = 0
rows = []
for ident, cost in own.items():
    name = names.get(ident, "?")
    if not name.startswith(root) or cost < requests:
        continue
    rel = name[len(root):]
    counted = not rel.startswith(aside)
    layer += counted
    rows.append((cost / requests, rel, counted))
for per, rel, counted in sorted(rows, reverse=True):
    print(f"  {per:8.0f}  {rel}{'' if counted else '   (aside)'}")
print(f"the layer's files: {layer}")
