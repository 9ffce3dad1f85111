#!/usr/bin/env bash
# Runs every cargo-fuzz target of tower-throttle (fuzz/fuzz_targets/: client_ip, key, config) for N
# seconds each (default 60). Installs cargo-fuzz (from crates.io) when it is missing. cargo-fuzz needs
# nightly compiler flags (-Zsanitizer=address); on a stable toolchain they are enabled with
# RUSTC_BOOTSTRAP=1.
#
#   bash scripts/fuzz.sh                  # every target, 60 s each
#   bash scripts/fuzz.sh 240              # every target, 4 minutes each
#   bash scripts/fuzz.sh 30 client_ip     # only the named targets
#   UPDATE_CORPUS=1 bash scripts/fuzz.sh  # afterwards, minimize what was found into fuzz/corpus/
#
# Inputs: the committed corpus fuzz/corpus/<target>/ (minimized) and the hand-written seeds
# fuzz/seeds/<target>/ are read; new inputs go to fuzz/target/corpus/<target>/ (not committed), so a
# run leaves the work tree clean. A crash stops the run and is saved under fuzz/artifacts/<target>/;
# reproduce it with `RUSTC_BOOTSTRAP=1 cargo fuzz run <target> fuzz/artifacts/<target>/<file>` in
# fuzz/. Not part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

say() { printf 'fuzz.sh: %s\n' "$*" >&2; }

seconds=${1:-60}
shift || true
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  targets=(client_ip key config)
fi
[[ $seconds =~ ^[0-9]+$ ]] || { say "usage: $0 [SECONDS] [TARGET...]"; exit 2; }

if ! cargo fuzz --version >/dev/null 2>&1; then
  say "installing cargo-fuzz from crates.io"
  cargo install cargo-fuzz --locked
fi

# cargo-fuzz passes -Z flags to rustc: allowed on stable with RUSTC_BOOTSTRAP=1.
if ! rustc --version | grep -q nightly; then
  export RUSTC_BOOTSTRAP=1
fi

for target in "${targets[@]}"; do
  mkdir -p "target/corpus/$target" "corpus/$target" "seeds/$target"
  say "$target: ${seconds}s"
  cargo fuzz run "$target" "target/corpus/$target" "corpus/$target" "seeds/$target" -- \
    -max_total_time="$seconds" -print_final_stats=1
  if [[ ${UPDATE_CORPUS:-0} == 1 ]]; then
    say "$target: minimizing into fuzz/corpus/$target"
    cp -n "target/corpus/$target"/* "corpus/$target"/ 2>/dev/null || true
    cargo fuzz cmin "$target" "corpus/$target" -- -set_cover_merge=1
  fi
done
say "done: ${#targets[@]} target(s), ${seconds}s each, no crash"
