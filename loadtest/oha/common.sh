# Shared by the oha scripts: talks to a running service's admin API.
# BASE_URL (default http://127.0.0.1:8080) and ADMIN_TOKEN (default
# $SECKILL_ADMIN_TOKEN, as scripts/run.sh prints it) say which service.
set -euo pipefail
BASE_URL="${BASE_URL:-http://127.0.0.1:8080}"
ADMIN_TOKEN="${ADMIN_TOKEN:-${SECKILL_ADMIN_TOKEN:-}}"
[ -n "$ADMIN_TOKEN" ] || { echo "set ADMIN_TOKEN (the service's SECKILL_ADMIN_TOKEN)" >&2; exit 2; }
command -v oha >/dev/null || { echo "oha is not installed: cargo install oha" >&2; exit 2; }

# A 503 is the instance shedding load (right after a flood, the admin's
# routes come back within a second or two): asked again a second later
# (what its Retry-After says), for up to 30 s.
admin() { # METHOD PATH [BODY]
    local answer code
    for _ in $(seq 1 30); do
        answer="$(curl -sS -w '\n%{http_code}' -X "$1" -H "Authorization: Bearer $ADMIN_TOKEN" \
            -H 'Content-Type: application/json' ${3:+-d "$3"} "$BASE_URL$2")"
        code="${answer##*$'\n'}"
        [ "$code" = 503 ] || break
        sleep 1
    done
    printf '%s\n' "${answer%$'\n'*}"
}

create_voucher() { # STOCK -> id
    local begin end
    begin="$(date -u -d '-1 minute' +%Y-%m-%dT%H:%M:%SZ)"
    end="$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ)"
    admin POST /admin/vouchers "{\"title\":\"oha\",\"stock\":$1,\"begin_time\":\"$begin\",\"end_time\":\"$end\"}" \
        | sed -E 's/.*"id":([0-9]+).*/\1/'
}

token() { # USER_ID -> token
    admin POST /admin/tokens "{\"user_ids\":[$1]}" | sed -E 's/.*"token":"([^"]+)".*/\1/'
}

expect_orders() { # VOUCHER EXPECTED
    local stats orders
    stats="$(admin GET "/admin/vouchers/$1/stats")"
    orders="$(echo "$stats" | sed -E 's/.*"orders":([0-9]+).*/\1/')"
    echo "voucher $1: $stats"
    if [ "$orders" != "$2" ]; then
        echo "INVARIANT BROKEN: expected $2 orders, found $orders" >&2
        exit 1
    fi
}
