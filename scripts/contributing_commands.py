#!/usr/bin/env python3
"""Every command CONTRIBUTING.md gives is run by CI, or names something that exists.

Reads each ```sh block of CONTRIBUTING.md. A test command (`cargo test …`, `cargo build …`,
`bash scripts/test.sh …`, or one prefixed by environment variables) must appear, as written, in
scripts/test.sh or .ci/run, which run it. The long-running ones that CI leaves out (benchmarks, the
load test, fuzzing, mutation testing) must name a bench target of Cargo.toml or a script that exists
and parses (`bash -n`). Prints a failing command with why (every command with `-v`); exits
non-zero on any.

Usage: python3 scripts/contributing_commands.py [-v]
"""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def read(path):
    with open(os.path.join(ROOT, path)) as f:
        return f.read()


def commands(markdown):
    for block in re.findall(r"```sh\n(.*?)```", markdown, re.S):
        for line in block.splitlines():
            # A comment starts at a '#' after whitespace.
            command = re.split(r"\s+#", line, maxsplit=1)[0].strip()
            if command and not command.startswith("#"):
                # `a; b` on one line: each its own command.
                for part in command.split(";"):
                    if part.strip():
                        yield part.strip()


def main():
    # The commands CI runs: each line of scripts/test.sh and .ci/run but comments, where a command
    # may follow environment settings (`env -u X PATH=… cargo test`).
    run_by = [
        line.strip()
        for line in (read("scripts/test.sh") + "\n" + read(".ci/run")).splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]

    def is_run(command):
        command = command.replace("$PWD/", "")
        return any(
            line.replace("$PWD/", "") == command or line.endswith(" " + command) for line in run_by
        )

    benches = set(re.findall(r'\[\[bench\]\]\s*\nname = "([^"]+)"', read("Cargo.toml")))
    failures = checked = 0
    verbose = "-v" in sys.argv[1:]
    for command in commands(read("CONTRIBUTING.md")):
        bench = re.fullmatch(r"cargo bench --bench (\S+)", command)
        script = re.search(r"\bbash (scripts/\S+\.sh)", command)
        if bench:
            ok = bench.group(1) in benches
            how = "a bench of Cargo.toml" if ok else "NO SUCH BENCH in Cargo.toml"
        elif is_run(command):
            ok, how = True, "run by scripts/test.sh or .ci/run"
        elif script:
            path = os.path.join(ROOT, script.group(1))
            ok = os.path.isfile(path) and subprocess.run(["bash", "-n", path]).returncode == 0
            how = "a script that exists and parses" if ok else "NO SUCH SCRIPT, or it does not parse"
        else:
            ok, how = False, "NOT RUN by scripts/test.sh or .ci/run"
        failures += not ok
        checked += 1
        if not ok or verbose:
            print(f"{'ok  ' if ok else 'FAIL'} {command}\n     {how}")
    if failures:
        print(f"{failures} command(s) of CONTRIBUTING.md are neither run nor valid", file=sys.stderr)
        return 1
    print(f"contributing_commands.py: each of CONTRIBUTING.md's {checked} commands is run by CI or valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
