#!/usr/bin/env bash
# Mutation testing of tower-throttle's pure modules and a request's path (no Redis, no network): cargo-mutants changes
# one thing in the code at a time (`>` into `>=`, a body into `Default::default()`, ...) and runs
# the tests that cover that file; a mutant that no test notices is a bug that could ship. Prints,
# per file, the mutants caught and missed, the score caught / (caught + missed), the time it took
# (and the load average beside it); lists the missed.
#
#   bash scripts/mutants.sh                      # every file below (~1,200 mutants: many hours on 2 cores)
#   bash scripts/mutants.sh src/window.rs ...    # only these files
#   MUTANTS_SHARD=1/4 bash scripts/mutants.sh    # a quarter of each file's mutants (round-robin)
#   MUTANTS_RE='parse_xff_entry' bash scripts/mutants.sh src/key/client_ip.rs   # only these mutants
#
# Equivalent mutants (no test can tell them apart from the code) are excluded in
# .cargo/mutants.toml, each with its reason. Not part of .ci/run: it takes too long on 2 cores.
# Installs cargo-mutants with `cargo install --locked` when it is missing. Results (outcomes.json,
# missed.txt, logs) are kept in target/mutants-out/<file>/mutants.out/.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'mutants.sh: %s\n' "$*" >&2; }

# The files, and the tests that cover each (no Redis): a mutant is built and tested with only
# these, so it costs one incremental build of the crate and the tests that can notice it. Pure
# modules are covered by the lib's unit tests beside them; the memory tables (and the algorithms
# they run) also by the memory backend's tests. After `--` come the test binaries' arguments: the
# lib's slowest tests (the top-keys sketches, the offenders estimate: 10-40 s of the lib's run on 2
# loaded cores) test none of these files, so they are skipped.
SKIP_SLOW="--skip top:: --skip offenders::"
# The memory binary's two slowest tests (5-7 s each) attack the GCRA table's cap: not the windows'.
SKIP_CAP="--skip attack:: --skip backend::memory_is_bounded"
declare -A TESTS=(
  [src/gcra.rs]="--lib -- $SKIP_SLOW"
  [src/window.rs]="--lib --test memory -- $SKIP_SLOW $SKIP_CAP"
  [src/quota.rs]="--lib -- $SKIP_SLOW"
  [src/headers.rs]="--lib -- $SKIP_SLOW"
  [src/key/client_ip.rs]="--lib -- $SKIP_SLOW"
  [src/limit.rs]="--lib --test memory -- $SKIP_SLOW"
  [src/backend/memory/gcra_table.rs]="--lib --test memory -- $SKIP_SLOW"
  [src/backend/memory/general.rs]="--lib --test memory -- $SKIP_SLOW"
  [src/backend/memory/general_shard.rs]="--lib --test memory -- $SKIP_SLOW"
  [src/backend/memory/entries.rs]="--lib --test memory -- $SKIP_SLOW"
  # A request's path, tested in process (no server): the lib's unit tests, the middleware binary
  # (the layer in axum, hyper and tonic, every mode and refusal), the observability binary (what a
  # request logs, in its own process) and, for metered limits, the memory backend's.
  [src/meter/mod.rs]="--lib --test middleware --test memory -- $SKIP_SLOW $SKIP_CAP"
  [src/engine/verdict.rs]="--lib --test middleware --test observability -- $SKIP_SLOW"
  # The extended path (per-customer quotas, counting by outcome, keys of their own, overrides,
  # metered limits, shadows) and the near-limit report: what the middleware binary drives through
  # the layer, the memory binary for metered settlements.
  [src/engine/extended.rs]="--lib --test middleware --test memory -- $SKIP_SLOW $SKIP_CAP"
  [src/near_limit.rs]="--lib --test middleware --test observability -- $SKIP_SLOW"
  # steps.rs also by the allocation test: a releaser made for a request that holds no slot is an
  # allocation on the admitted path, and nothing else shows it.
  [src/engine/steps.rs]="--lib --test middleware --test observability --test alloc -- $SKIP_SLOW"
  # service.rs runs those steps for a request (`Throttle::call`): the same tests as steps.rs, the
  # allocation test too, as the plain admission it builds no verdict for is what that test counts.
  [src/middleware/service.rs]="--lib --test middleware --test observability --test alloc -- $SKIP_SLOW"
  # Carrying a verdict out (after a remote decision, a delay, a body read): the layer's tests,
  # the overload gate's counts in flight, the admitted path's allocations.
  [src/middleware/future.rs]="--lib --test middleware --test observability --test overload --test alloc -- $SKIP_SLOW"
  [src/rollout/mod.rs]="--lib --test middleware --test observability -- $SKIP_SLOW"
  # A stream message's check (ThrottleHandle::check): its pre-checks and the judge's steps it
  # shares with a request, through the handle in the middleware binary.
  [src/handle/message.rs]="--lib --test middleware -- $SKIP_SLOW"
  # Counting by outcome: a response's status decides whether the request's units are given back.
  [src/outcome.rs]="--lib --test middleware -- $SKIP_SLOW"
  # What the last round added to a request's path, each covered by the unit tests beside it: a
  # policy's conditions (host, header, query), the JSON reader of a body key, and the overrides and
  # timed bans in force (read, refreshed and listened for through a test's own shared records).
  [src/policy/condition.rs]="--lib -- $SKIP_SLOW"
  # The query scan that a policy's query conditions and QueryParam keys share, with the other key
  # sources: the unit tests beside them, and the middleware binary (every key source in a layer).
  [src/key/sources.rs]="--lib --test middleware -- $SKIP_SLOW"
  [src/key/body/json.rs]="--lib -- $SKIP_SLOW"
  [src/overrides/cache.rs]="--lib -- $SKIP_SLOW"
  # IPv6 patterns: written (the handle's tests) and matched (the cache's) in whole groups.
  [src/overrides/ipv6.rs]="--lib -- $SKIP_SLOW"
  # The charges a request asks of a backend (and the decisions back), and the table of features a
  # policy cannot use together: the unit tests beside them.
  [src/backend/charge.rs]="--lib -- $SKIP_SLOW"
  [src/policy/compat.rs]="--lib -- $SKIP_SLOW"
  # The overload gate (step 1b of every request of a layer that has one): its admission,
  # partitions and count in flight, its options, and the adaptive limit — the unit tests beside
  # them, the middleware binary (the gate in a layer), the simulator (the limit over scenarios,
  # whose report must not change) and the allocation test (a gated admission allocates nothing).
  # How a refusal is answered (429, 403, 503, the missing key's 4xx; gRPC, the custom functions,
  # the on_limited hook), how the extended path comes by its key (async, from the body), and the
  # failure policy (allow, deny, the local limiter): the middleware binary drives each through a
  # layer.
  # What the judge hands to the features it steps through: the penalty box's strike, delay mode's
  # wait (a tier's), the decision handlers see.
  [src/penalty.rs]="--lib --test middleware -- $SKIP_SLOW"
  # A stack's decisions as one (a refusal's figures, the legacy headers'): its tests and headers'.
  [src/decision.rs]="--lib -- $SKIP_SLOW"
  # A policy's route and a path key's parameter (inside axum's nested routers too).
  [src/route.rs]="--lib --test middleware -- $SKIP_SLOW"
  [src/policy/tier.rs]="--lib --test middleware -- $SKIP_SLOW"
  [src/policy_decision.rs]="--lib --test middleware -- $SKIP_SLOW"
  [src/refusal/respond.rs]="--lib --test middleware -- $SKIP_SLOW"
  [src/key/ahead.rs]="--lib --test middleware -- $SKIP_SLOW"
  [src/failure/mod.rs]="--lib --test middleware -- $SKIP_SLOW"
  [src/failure/verdict.rs]="--lib --test middleware -- $SKIP_SLOW"
  # extras.rs: the per-request features a policy keeps, and the rule for an override's quota.
  [src/policy/extras.rs]="--lib --test middleware -- $SKIP_SLOW"
  [src/overload/gate.rs]="--lib --test middleware --test overload --test alloc -- $SKIP_SLOW"
  [src/overload/options.rs]="--lib --test middleware --test overload -- $SKIP_SLOW"
  [src/overload/limit.rs]="--lib --test overload -- $SKIP_SLOW"
  [src/overload/limit/little.rs]="--lib --test overload -- $SKIP_SLOW"
  # Calendar windows (feature `calendar`: all features, as the bodies cut out without it are
  # excluded): the unit tests beside them, on instants written out by hand.
  [src/calendar.rs]="--all-features --lib -- $SKIP_SLOW"
  # What the log last said of a Cluster node's breaker (a node that flaps): its unit test.
  [src/backend/redis/health/told.rs]="--all-features --lib -- told::"
  # The Redis glue: the Redis test binary (needs redis-server, and REDIS_CELL_MODULE or
  # target/redis-cell from `bash scripts/test.sh --setup-only`), only the tests that read it.
  # gcra_group.rs turns a coalesced group's one backlog into each check's answer: the batch tests
  # compare that with one-at-a-time gcra.lua calls (the test binary includes the same file).
  [src/backend/redis/speedup/gcra_group.rs]="--all-features --test redis -- batch:: metered_parity::"
  # A limits.lua call as data, alone or in a batch: the batch and parity tests of every algorithm.
  [src/backend/redis/wire/limits_call.rs]="--all-features --test redis -- batch_limits:: parity::"
  # The scripts' arguments and keys: every algorithm's exact-count and parity tests.
  [src/backend/redis/wire/args.rs]="--all-features --test redis -- batch:: batch_limits:: parity:: algorithms::"
)
FILES=(src/gcra.rs src/window.rs src/quota.rs src/headers.rs src/key/client_ip.rs src/limit.rs
  src/backend/memory/gcra_table.rs src/backend/memory/general.rs src/backend/memory/general_shard.rs
  src/backend/memory/entries.rs src/meter/mod.rs src/engine/verdict.rs src/engine/steps.rs
  src/middleware/service.rs src/middleware/future.rs src/engine/extended.rs src/near_limit.rs src/rollout/mod.rs src/handle/message.rs src/outcome.rs src/policy/condition.rs src/key/sources.rs src/key/body/json.rs
  src/overrides/cache.rs src/overrides/ipv6.rs src/backend/charge.rs src/policy/compat.rs src/calendar.rs
  src/penalty.rs src/decision.rs src/policy/tier.rs src/policy_decision.rs src/refusal/respond.rs src/key/ahead.rs src/failure/mod.rs src/failure/verdict.rs src/policy/extras.rs
  src/overload/gate.rs src/overload/options.rs src/overload/limit.rs src/overload/limit/little.rs
  src/backend/redis/health/told.rs)

if ! cargo mutants --version >/dev/null 2>&1; then
  say "installing cargo-mutants (cargo install cargo-mutants --locked)"
  cargo install cargo-mutants --locked
fi

# An exclusion anchored to a line (`src/x.rs:LINE:COL: ...`) names one mutant by its place, and an
# edit above it moves the place: each must still name a mutant, or the run would report that
# equivalent mutant as missed (and exclude nothing, or the wrong one). Unanchored ones too: code
# moved into a macro (which cargo-mutants does not mutate) leaves them naming nothing.
cargo mutants --list --no-config | python3 -c '
import re, sys
listed = sys.stdin.read().splitlines()
config = open(".cargo/mutants.toml").read()
stale = [p for p in re.findall(r"^\s*\x27([^\x27]+)\x27,?\s*$", config, re.M)
         if not any(re.search(p, m) for m in listed)]
for p in stale:
    print(f"mutants.sh: stale exclusion in .cargo/mutants.toml (no mutant at that place): {p}", file=sys.stderr)
sys.exit(1 if stale else 0)
' || { say "re-anchor the exclusions above (cargo mutants --list shows where their mutants are now)"; exit 1; }

files=("$@")
[ ${#files[@]} -gt 0 ] || files=("${FILES[@]}")
for file in "${files[@]}"; do
  [ -f "$file" ] || { say "no such file: $file (the modules may have moved: edit FILES)"; exit 1; }
  [ -n "${TESTS[$file]:-}" ] || { say "$file: no test binaries listed for it in TESTS (add it)"; exit 1; }
done
# MUTANTS_BASELINE=skip: no run of the unmutated tests first (when you know they pass): saves one
# build and test run per file; the test timeout is then MUTANTS_TIMEOUT (default 120 s: each test
# binary below runs in 1-6 s on 2 loaded cores, and a mutant that makes a loop endless, as several
# of gcra.rs's `intervals_in` do, costs the whole timeout).
baseline=()
[ "${MUTANTS_BASELINE:-}" != skip ] || baseline=(--baseline=skip --timeout "${MUTANTS_TIMEOUT:-120}")
# MUTANTS_RE='regex': only the mutants whose name (as `cargo mutants --list` prints it) matches,
# e.g. to see the test you wrote catch the mutant that was missed.
filter=()
[ -z "${MUTANTS_RE:-}" ] || filter=(--re "$MUTANTS_RE")
shard=()
[ -z "${MUTANTS_SHARD:-}" ] || shard=(--shard "$MUTANTS_SHARD" --sharding round-robin)
out=target/mutants-out
mkdir -p "$out"
# The mutants are made in one copy of the tree at a fixed path (tracked and untracked files, with
# new modification times: the build left by the last run's last mutant is older than them, so cargo
# rebuilds the crate for the baseline instead of testing that mutant again), tested in place there (cargo-mutants --in-place: your tree is never touched), and
# built into one target dir kept between runs (profile `mutants` in Cargo.toml: no debug info). So
# the dependencies are built once, not once per run, and every mutant's build is incremental, also
# across files and runs (cargo-mutants' own fresh copy per run rebuilds the crate each time).
tree="$PWD/target/mutants-tree"
rm -rf "$tree"
mkdir -p "$tree"
git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xmf - -C "$tree"
export CARGO_TARGET_DIR="$PWD/target/mutants-build"
# The Redis tests find the module through this (the copy has no target/redis-cell of its own).
if [ -z "${REDIS_CELL_MODULE:-}" ] && [ -f target/redis-cell/libredis_cell.so ]; then
  export REDIS_CELL_MODULE="$PWD/target/redis-cell/libredis_cell.so"
fi
out="$PWD/$out"

# One cargo-mutants run per file, with that file's test binaries; the default features unless
# TESTS names others (the crate builds faster without Redis and axum): the Redis glue and
# calendar.rs need theirs.
started=$SECONDS
outcome_files=()
for file in "${files[@]}"; do
  name=$(echo "$file" | tr / _)
  # Before `--`: cargo's (the build's too); after it: the test binaries'.
  cargo_args=()
  binary_args=()
  for a in ${TESTS[$file]}; do
    if [ ${#binary_args[@]} -gt 0 ] || [ "$a" = -- ]; then
      binary_args+=("--cargo-test-arg=$a")
    else
      cargo_args+=("--cargo-arg=$a")
    fi
  done
  say "$file: cargo test ${TESTS[$file]}; log in $out/$name.log"
  file_started=$SECONDS
  load_before=$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo '?')
  # cargo-mutants exits non-zero when a mutant is missed: the summary below says which.
  (cd "$tree" && cargo mutants --file "$file" --profile mutants --in-place \
    --minimum-test-timeout "${MUTANTS_MIN_TEST_TIMEOUT:-60}" "${cargo_args[@]}" "${binary_args[@]}" --no-shuffle \
    "${shard[@]}" "${filter[@]}" "${baseline[@]}" --output "$out/$name") >"$out/$name.log" 2>&1 || true
  elapsed=$((SECONDS - file_started))
  # The load average (at the start and the end) beside the time: a mutant costs 2-3 times as
  # much on a loaded machine.
  load="$load_before-$(cut -d' ' -f1 /proc/loadavg 2>/dev/null || echo '?')"
  say "$file: $elapsed s (load $load)"
  outcome_files+=("$elapsed:$load:$out/$name/mutants.out/outcomes.json")
done

echo
echo "mutants.sh: caught / (caught + missed) per file, $((SECONDS - started)) s${MUTANTS_SHARD:+, shard $MUTANTS_SHARD}:"
python3 - "${outcome_files[@]}" <<'PY'
import json, os, sys
per_file, missed, failed, timing = {}, [], [], {}
for arg in sys.argv[1:]:
    elapsed, load, path = arg.split(":", 2)
    if not os.path.exists(path):
        failed.append(f"  no outcomes in {path}: see the log beside it")
        continue
    for o in json.load(open(path))["outcomes"]:
        scenario = o["scenario"]
        if not isinstance(scenario, dict):  # "Baseline"
            if o.get("summary") != "Success":
                failed.append(f"  {path}: the baseline failed ({o.get('summary')}): the tests fail unmutated")
            continue
        m = scenario["Mutant"]
        file, summary = m["file"], o["summary"]
        timing[file] = (int(elapsed), load)
        counts = per_file.setdefault(file, {})
        counts[summary] = counts.get(summary, 0) + 1
        if summary == "MissedMutant":
            line = m.get("span", {}).get("start", {}).get("line", "?")
            missed.append(f"  missed: {file}:{line}: {m.get('function', {}).get('function_name', '')}: {m.get('genre', '')} {m.get('replacement', '')}")
for file, counts in per_file.items():
    caught, miss = counts.get("CaughtMutant", 0), counts.get("MissedMutant", 0)
    score = f"{100 * caught / (caught + miss):.0f} %" if caught + miss else "n/a"
    elapsed, load = timing[file]
    tested = sum(counts.values())
    print(f"  {file}: {caught}/{caught + miss} = {score} (timeouts {counts.get('Timeout', 0)}, unviable {counts.get('Unviable', 0)});"
          f" {elapsed} s, {elapsed / tested:.0f} s a mutant, load {load} (1-minute average at its start-end)")
print("\n".join(failed + missed))
sys.exit(1 if failed else 0)
PY
