#!/usr/bin/env bash
# Brings up Postgres and Redis (see deps.sh), then runs the service with a
# demo voucher. Ctrl-C stops it gracefully. Extra arguments go to `seckill`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

if [ -z "${SECKILL_ADMIN_TOKEN:-}" ]; then
    SECKILL_ADMIN_TOKEN="$(head -c 32 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=')"
    export SECKILL_ADMIN_TOKEN
    echo "Admin token for this run: $SECKILL_ADMIN_TOKEN"
fi
# SECKILL_LAB=1 runs seckill-lab, the service with the lab mounted (LAB.md).
if [ "${SECKILL_LAB:-0}" = 1 ]; then
    exec cargo run --release --quiet -p seckill-lab -- serve --demo "$@"
fi
exec cargo run --release --quiet --bin seckill -- serve --demo "$@"
