#!/usr/bin/env bash
# Refreshes the guide's pictures of the storefront and the sale monitor
# (docs/guide/src/img/shop-*.png, monitor.png): the browser tests take
# them where SECKILL_SCREENSHOTS points.
set -euo pipefail
cd "$(dirname "$0")/.."
SECKILL_TEST_TOOLS=1 source scripts/deps.sh
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
SECKILL_SCREENSHOTS="$out" cargo test --test api browser:: -- --test-threads=1
for picture in shop-unpaid.png monitor.png; do
    cp "$out/$picture" docs/guide/src/img/
done
echo "screenshots: docs/guide/src/img/shop-unpaid.png, docs/guide/src/img/monitor.png" >&2
