#!/usr/bin/env bash
# One user, many concurrent purchases: exactly one order.
#   REQUESTS (10000), CONNECTIONS (200); see common.sh for the target.
source "$(dirname "$0")/common.sh"
voucher="$(create_voucher 10)"
user_token="$(token 1)"
oha --no-tui -n "${REQUESTS:-10000}" -c "${CONNECTIONS:-200}" -m POST \
    -H "Authorization: Bearer $user_token" "$BASE_URL/seckill/$voucher"
expect_orders "$voucher" 1
