#!/usr/bin/env bash
# Runs every test of tower-throttle: unit, integration (including the example server over TCP) and
# doc tests, with every feature. Installs what the tests need when it is missing (nothing yet beyond the
# Rust toolchain; the Redis backend's servers will be installed here).
set -euo pipefail
cd "$(dirname "$0")/.."

# Examples are built first: tests/example_server.rs runs the example binary.
cargo build --all-features --examples
cargo test --all-features "$@"
