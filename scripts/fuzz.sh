#!/usr/bin/env bash
# Contract fuzzing: Schemathesis (PyPI) drives the service's own
# /openapi.json against a running instance, once with the admin token and
# once with a user's token, with the checks not_a_server_error,
# status_code_conformance, content_type_conformance,
# response_schema_conformance and negative_data_rejection. Bounded in time.
# Exits non-zero on any failure. Postgres and Redis as in deps.sh; the
# service runs as scripts/service.sh starts it.
#   FUZZ_EXAMPLES  examples per operation and phase (default 50)
#   FUZZ_SECONDS   time budget of each run (default 120)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh

if ! command -v st >/dev/null; then
    echo "fuzz: installing schemathesis" >&2
    python3 -m pip install --quiet --disable-pip-version-check schemathesis
fi

# The fuzzer's own flood can saturate a two-core machine, and the shedder
# then answers 503 unavailable, as the contract says it may: a refusal of
# load, not a fault of the contract's shapes, which is what this checks.
# Shedding has its own tests (tests/api/shed.rs, loadtest abuse).
export SECKILL_SHED_DELAY_MS=0
source scripts/service.sh
start_service
admin="$ADMIN"
base="$BASE"

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
