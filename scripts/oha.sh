#!/usr/bin/env bash
# The oha scripts (loadtest/oha/) against a service of their own: one user
# hammering (exactly one order) and a sold-out flood (still one order). Each
# script checks its voucher's orders through the admin API and fails if an
# invariant broke. Installs oha (crates.io) if it is missing: a debug build
# (a few thousand requests need no optimiser, and the release build took
# seven minutes on a slow two-core machine) kept in the user's cache
# folder, so that a fresh clone (CI's) finds it, off the PATH of other work.
#   REQUESTS (2000), DURATION (3s), CONNECTIONS (100)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
tools="${XDG_CACHE_HOME:-$HOME/.cache}/seckill-tools/oha"
export PATH="$tools/bin:$PATH"
if ! command -v oha >/dev/null; then
    echo "oha: installing it (cargo install --locked --debug oha, into $tools)" >&2
    cargo install --locked --quiet --debug --root "$tools" oha
fi
source scripts/service.sh
start_service
export BASE_URL="$BASE" ADMIN_TOKEN="$ADMIN"
REQUESTS="${REQUESTS:-2000}" CONNECTIONS="${CONNECTIONS:-100}" loadtest/oha/hammer.sh
DURATION="${DURATION:-3s}" CONNECTIONS="${CONNECTIONS:-100}" loadtest/oha/soldout.sh
