#!/usr/bin/env bash
# Contract fuzzing: Schemathesis (PyPI) drives the service's own
# /openapi.json against a running instance, once with the admin token and
# once with a user's token, with the checks not_a_server_error,
# status_code_conformance, content_type_conformance,
# response_schema_conformance and negative_data_rejection. Bounded in time.
# Exits non-zero on any failure. Postgres and Redis as in deps.sh; the
# service runs on a free port against a database of its own, dropped after.
#   FUZZ_EXAMPLES  examples per operation and phase (default 50)
#   FUZZ_SECONDS   time budget of each run (default 120)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

if ! command -v st >/dev/null; then
    echo "fuzz: installing schemathesis" >&2
    python3 -m pip install --quiet --disable-pip-version-check schemathesis
fi

run="$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
server="${DATABASE_URL%/*}"
db="seckill_fuzz_$run"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
admin="fuzz-admin-$run"
base="http://127.0.0.1:$port"

cargo build --quiet --release --bin seckill
DATABASE_URL="$server/$db" SECKILL_ADDR="127.0.0.1:$port" SECKILL_ADMIN_TOKEN="$admin" \
    SECKILL_REDIS_PREFIX="fuzz:$run:" RUST_LOG=warn \
    target/release/seckill serve > "target/fuzz-$run.log" 2>&1 &
pid=$!
cleanup() {
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    psql "$server/postgres" -q -c "DROP DATABASE IF EXISTS \"$db\" WITH (FORCE)" >/dev/null 2>&1 || true
}
trap cleanup EXIT
for _ in $(seq 1 100); do
    curl -sf "$base/readyz" >/dev/null && break
    sleep 0.2
done
curl -sf "$base/readyz" >/dev/null || { echo "fuzz: the service did not start" >&2; cat "target/fuzz-$run.log" >&2; exit 1; }

# A voucher on sale and a user's token, so that user routes get past auth.
curl -sf -X POST -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
    -d '{"title":"fuzz","stock":1000000,"begin_time":"2020-01-01T00:00:00Z","end_time":"2099-01-01T00:00:00Z"}' \
    "$base/admin/vouchers" >/dev/null
user="$(curl -sf -X POST -H "Authorization: Bearer $admin" -H 'Content-Type: application/json' \
    -d '{"user_ids":[1]}' "$base/admin/tokens" | python3 -c 'import json,sys; print(json.load(sys.stdin)["tokens"][0]["token"])')"

checks="not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,negative_data_rejection"
for who in admin user; do
    token="$admin"; [ "$who" = user ] && token="$user"
    echo "fuzz: as $who" >&2
    st run "$base/openapi.json" --header "Authorization: Bearer $token" \
        --checks "$checks" \
        --max-examples "${FUZZ_EXAMPLES:-50}" --max-time "${FUZZ_SECONDS:-120}" \
        --no-color
done
