#!/usr/bin/env python3
"""The example server's start-up: the time from starting its process to its first HTTP answer, in
memory and on Redis (a redis-server of its own on loopback, with the redis-cell module when
REDIS_CELL_MODULE names it), ROUNDS times each, interleaved; prints the median, min and max. Given
several server binaries (two builds), it interleaves them too.

    cargo build --release --all-features --example server
    python3 scripts/first_answer.py target/release/examples/server      # ROUNDS=9 by default
    python3 scripts/first_answer.py /tmp/server-before target/release/examples/server

The clock starts just before the process is spawned and stops when a `GET /` on a new connection
has read an answer's status line; connection attempts are retried every 0.5 ms until then.
"""

import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

servers = sys.argv[1:] or ["target/release/examples/server"]
rounds = int(os.environ.get("ROUNDS", "9"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answered(port):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
            s.sendall(b"GET / HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            return s.recv(64).startswith(b"HTTP/1.1 ")
    except OSError:
        return False


def first_answer(server, args):
    port = free_port()
    start = time.perf_counter()
    proc = subprocess.Popen([server, "--listen", f"127.0.0.1:{port}", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = start + 30
        while not answered(port):
            if proc.poll() is not None:
                sys.exit(f"the server exited with {proc.returncode} before answering ({args})")
            if time.perf_counter() > deadline:
                sys.exit(f"no answer within 30 s ({args})")
            time.sleep(0.0005)
        return (time.perf_counter() - start) * 1000
    finally:
        proc.kill()
        proc.wait()


def main():
    tmp = tempfile.mkdtemp()
    rport = free_port()
    redis_args = ["redis-server", "--port", str(rport), "--save", "", "--appendonly", "no",
                  "--dir", tmp]
    module = os.environ.get("REDIS_CELL_MODULE")
    if module:
        redis_args += ["--loadmodule", module]
    redis = subprocess.Popen(redis_args, stdout=subprocess.DEVNULL)
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", rport), timeout=1).close()
                break
            except OSError:
                time.sleep(0.01)
        cases = {
            "memory": [],
            "redis" + (" (redis-cell loaded, auto)" if module else " (auto)"):
                ["--redis", f"redis://127.0.0.1:{rport}/"],
        }
        times = {(server, name): [] for server in servers for name in cases}
        for _ in range(rounds):
            for server in servers:
                for name, args in cases.items():
                    times[server, name].append(first_answer(server, args))
        print(f"ms from spawn to the first answer, {rounds} rounds each, interleaved")
        for (server, name), ms in times.items():
            print(f"  {server}, {name}: median {statistics.median(ms):.1f}, "
                  f"min {min(ms):.1f}, max {max(ms):.1f}")
    finally:
        redis.kill()
        redis.wait()


main()
