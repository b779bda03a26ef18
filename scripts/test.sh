#!/usr/bin/env bash
# Brings up Postgres and Redis (see deps.sh), then runs every test.
# Extra arguments go to `cargo test` (a test name filters).
set -euo pipefail
cd "$(dirname "$0")/.."
SECKILL_TEST_TOOLS=1 source scripts/deps.sh
exec cargo test --workspace "$@"
