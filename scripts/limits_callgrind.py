#!/usr/bin/env python3
"""Instructions per decision that Redis spends inside EVALSHA of limits_batch.lua (or limits.lua
alone), counted by callgrind: deterministic, unlike the wall-clock `usec` of INFO commandstats on a
loaded machine. A redis-server of its own runs under valgrind (collection toggled on
evalShaCommand); for each case, CALLS calls of a batch of ITEMS checks of one hot key (every check
admitted and written), and the instructions divided by the decisions.

    python3 scripts/limits_callgrind.py DIR ITEMS CALLS      # DIR: prelude.lua, limits.lua, limits_batch.lua
    ALONE=1 python3 scripts/limits_callgrind.py DIR 1 CALLS  # limits.lua alone, one check a call

e.g. DIR=src/backend/redis/wire, and a copy of main's three files in another DIR (git show main:...).
Cases: sw (sliding window), fw (fixed window), gcra (limits.lua's GCRA), stack (GCRA + fixed +
sliding window), log (sliding log). Needs valgrind and redis-server.
"""
import glob
import os
import re
import socket
import subprocess
import sys
import tempfile
import time

d, items, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
alone = bool(os.environ.get('ALONE'))
parts = ['prelude.lua', 'limits.lua'] + ([] if alone else ['limits_batch.lua'])
src = b'#!lua\n' + b''.join(open(os.path.join(d, p), 'rb').read() for p in parts)
if alone:
    src += b'return limits(KEYS, ARGV)\n'
tmp = tempfile.mkdtemp()
out = os.path.join(tmp, 'cg')
port = 24000 + os.getpid() % 1000
srv = subprocess.Popen(['valgrind', '--tool=callgrind', '--toggle-collect=evalShaCommand',
                        f'--callgrind-out-file={out}.%p', 'redis-server', '--port', str(port),
                        '--save', '', '--appendonly', 'no', '--dir', tmp],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(600):
    try:
        s = socket.create_connection(('127.0.0.1', port))
        break
    except OSError:
        time.sleep(0.1)
f = s.makefile('rb')


def cmd(*args):
    o = b'*%d\r\n' % len(args)
    for x in args:
        x = x if isinstance(x, bytes) else str(x).encode()
        o += b'$%d\r\n%s\r\n' % (len(x), x)
    s.sendall(o)
    return read()


def read():
    line = f.readline()
    t, rest = line[:1], line[1:-2]
    if t in (b'+', b':'):
        return rest
    if t == b'-':
        raise Exception(rest)
    if t == b'$':
        n = int(rest)
        return None if n < 0 else f.read(n + 2)[:-2]
    if t == b'*':
        n = int(rest)
        return [read() for _ in range(n)] if n >= 0 else None


def call(sha, spec):
    """One EVALSHA: limits.lua's arguments for one check (as limits_call.rs writes them), or a batch
    of ITEMS such checks (as batch.rs writes them)."""
    keys = ['{k}:%d' % j for j in range(len(spec))]
    one = [len(spec), 1, 1000, 0, 0, 0] + [x for limit in spec for x in limit]
    if alone:
        return ['EVALSHA', sha, len(keys)] + keys + one
    args = [items]
    for i in range(items):
        one[2] = 1000 + i
        args += [len(spec), len(one)] + one
    return ['EVALSHA', sha, len(keys) * items] + keys * items + args


HOUR_US = 3_600_000_000
SW, FW, LOG = [3, 500000, HOUR_US, 0], [2, 500000, HOUR_US, 0], [1, 500000, HOUR_US, 0]
GCRA = [0, 500000, 7_200_000, 3_600_000_000_000]
cases = {'sw': [SW], 'fw': [FW], 'gcra': [GCRA], 'stack': [GCRA, FW, SW], 'log': [LOG]}
sha = cmd('SCRIPT', 'LOAD', src).decode()
cmd(*call(sha, [SW]))  # warm-up


def dump():
    subprocess.run(['callgrind_control', '-d', str(srv.pid)], capture_output=True)
    time.sleep(0.3)


dump()
res = {}
for case, spec in cases.items():
    cmd('FLUSHALL')
    seen = set(glob.glob(out + '*'))
    for _ in range(calls):
        cmd(*call(sha, spec))
    dump()
    new = sorted(set(glob.glob(out + '*')) - seen, key=os.path.getmtime)
    total = int(re.search(r'^(?:totals|summary): (\d+)', open(new[-1]).read(), re.M).group(1))
    res[case] = total / (calls * (1 if alone else items))
srv.terminate()
srv.wait()
label = 'limits.lua alone' if alone else f'limits_batch.lua, {items} checks a call'
print(f'{d}: {label}, instructions per decision: ' + ', '.join(f'{c} {v:,.0f}' for c, v in res.items()))
