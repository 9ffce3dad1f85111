#!/usr/bin/env bash
# Mutation testing of tower-throttle's pure modules (no Redis, no network): cargo-mutants changes
# one thing in the code at a time (`>` into `>=`, a body into `Default::default()`, ...) and runs
# the tests that cover that file; a mutant that no test notices is a bug that could ship. Prints,
# per file, the mutants caught and missed and the score caught / (caught + missed); lists the missed.
#
#   bash scripts/mutants.sh                      # every file below (~900 mutants: many hours on 2 cores)
#   bash scripts/mutants.sh src/window.rs ...    # only these files
#   MUTANTS_JOBS=2 bash scripts/mutants.sh       # parallel builds (default 1: a shared machine)
#   MUTANTS_SHARD=1/4 bash scripts/mutants.sh    # a quarter of each file's mutants (round-robin)
#
# Equivalent mutants (no test can tell them apart from the code) are excluded in
# .cargo/mutants.toml, each with its reason. Not part of .ci/run: it takes too long on 2 cores.
# Installs cargo-mutants with `cargo install --locked` when it is missing. Results (outcomes.json,
# missed.txt, logs) are kept in target/mutants/mutants.out/.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'mutants.sh: %s\n' "$*" >&2; }

# The files, and the test binaries that cover them: the lib's unit tests (the algorithms, quotas,
# headers, client IPs) and the memory backend's tests (its tables, through the backend). No Redis.
FILES=(src/gcra.rs src/window.rs src/quota.rs src/headers.rs src/key/client_ip.rs src/limit.rs
  src/backend/memory/gcra_table.rs src/backend/memory/general.rs src/backend/memory/general_shard.rs
  src/backend/memory/entries.rs)
TEST_ARGS=(--lib --test memory)

if ! cargo mutants --version >/dev/null 2>&1; then
  say "installing cargo-mutants (cargo install cargo-mutants --locked)"
  cargo install cargo-mutants --locked
fi

files=("$@")
[ ${#files[@]} -gt 0 ] || files=("${FILES[@]}")
file_args=()
for file in "${files[@]}"; do
  [ -f "$file" ] || { say "no such file: $file (the modules may have moved: edit FILES)"; exit 1; }
  file_args+=(--file "$file")
done
cargo_args=()
for a in "${TEST_ARGS[@]}"; do cargo_args+=("--cargo-arg=$a"); done
shard=()
[ -z "${MUTANTS_SHARD:-}" ] || shard=(--shard "$MUTANTS_SHARD" --sharding round-robin)
out=target/mutants
mkdir -p "$out"

# One run for all files: cargo-mutants copies the tree (target/ included) once and builds it once
# (its flags differ from a normal build's, so the first build recompiles the dependencies).
say "${files[*]}: cargo test ${TEST_ARGS[*]}; log in $out/log.txt"
started=$SECONDS
# cargo-mutants exits non-zero when a mutant is missed: the summary below says which.
cargo mutants "${file_args[@]}" --all-features --jobs "${MUTANTS_JOBS:-1}" --copy-target=true \
  "${cargo_args[@]}" --no-shuffle "${shard[@]}" --output "$out" >"$out/log.txt" 2>&1 || true
outcomes="$out/mutants.out/outcomes.json"
[ -f "$outcomes" ] || { say "no outcomes (see $out/log.txt)"; tail -20 "$out/log.txt"; exit 1; }

echo
echo "mutants.sh: caught / (caught + missed) per file, $((SECONDS - started)) s${MUTANTS_SHARD:+, shard $MUTANTS_SHARD}:"
python3 - "$outcomes" "${files[@]}" <<'PY'
import json, sys
path, files = sys.argv[1], sys.argv[2:]
data = json.load(open(path))
per_file = {f: {} for f in files}
missed = []
for o in data["outcomes"]:
    scenario = o["scenario"]
    if not isinstance(scenario, dict):  # "Baseline"
        if o.get("summary") != "Success":
            sys.exit(f"the baseline failed ({o.get('summary')}): the tests fail unmutated")
        continue
    m = scenario["Mutant"]
    file = m["file"]
    summary = o["summary"]
    per_file.setdefault(file, {})
    per_file[file][summary] = per_file[file].get(summary, 0) + 1
    if summary == "MissedMutant":
        line = m.get("span", {}).get("start", {}).get("line", "?")
        missed.append(f"  missed: {file}:{line}: {m.get('function', {}).get('function_name', '')}: {m.get('genre', '')} {m.get('replacement', '')}")
for file, counts in per_file.items():
    caught, miss = counts.get("CaughtMutant", 0), counts.get("MissedMutant", 0)
    score = f"{100 * caught / (caught + miss):.0f} %" if caught + miss else "n/a"
    print(f"  {file}: {caught}/{caught + miss} = {score} (timeouts {counts.get('Timeout', 0)}, unviable {counts.get('Unviable', 0)})")
print("\n".join(missed))
PY
