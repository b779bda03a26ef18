#!/usr/bin/env bash
# A sold-out voucher flooded for a while, then /healthz at the same
# concurrency for comparison: rejections per second against the HTTP
# ceiling. DURATION (10s), CONNECTIONS (200); see common.sh for the target.
source "$(dirname "$0")/common.sh"
voucher="$(create_voucher 1)"
curl -sS -X POST -H "Authorization: Bearer $(token 1)" "$BASE_URL/seckill/$voucher" >/dev/null
user_token="$(token 2)"
echo "== sold-out flood"
oha --no-tui -z "${DURATION:-10s}" -c "${CONNECTIONS:-200}" -m POST \
    -H "Authorization: Bearer $user_token" "$BASE_URL/seckill/$voucher"
echo "== /healthz at the same concurrency"
oha --no-tui -z "${DURATION:-10s}" -c "${CONNECTIONS:-200}" "$BASE_URL/healthz"
expect_orders "$voucher" 1
