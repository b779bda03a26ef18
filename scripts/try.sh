# Helpers for the guide's "Try it" sections. With scripts/run.sh running in
# one shell, in another, from the repository's root:
#
#   ADMIN=<the admin token run.sh printed>
#   source scripts/try.sh
#
# BASE is the service's address (default http://127.0.0.1:8080). Needs curl,
# python3 and GNU date. tests/guide_try_it.rs runs every "Try it" section
# with these helpers.

BASE="${BASE:-http://127.0.0.1:8080}"
if [ -z "${ADMIN:-}" ]; then
    echo "set ADMIN to the admin token scripts/run.sh printed, then source this again" >&2
fi

# A field of the JSON on stdin: `json '["id"]'`.
json() {
    python3 -c "import json, sys; print(json.load(sys.stdin)$1)"
}

# A user token for the user id $1 (minted by the admin route).
token() {
    curl -s -X POST "$BASE/admin/tokens" -H "Authorization: Bearer $ADMIN" \
        -H 'Content-Type: application/json' -d "{\"user_ids\": [$1]}" |
        json '["tokens"][0]["token"]'
}

# A new voucher on sale from now for an hour, with the fields given as JSON
# in $1 (`voucher '"stock": 5'`); prints its id.
voucher() {
    local begin end
    begin="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    end="$(date -u -d '+1 hour' +%Y-%m-%dT%H:%M:%SZ)"
    curl -s -X POST "$BASE/admin/vouchers" -H "Authorization: Bearer $ADMIN" \
        -H 'Content-Type: application/json' \
        -d "{\"title\": \"Try it\", \"begin_time\": \"$begin\", \"end_time\": \"$end\", $1}" |
        json '["id"]'
}

# Runs the command "$2"... once a second until what it prints contains $1,
# 20 times at most; prints the last answer, and fails saying so if $1 never
# came: `until_has '"status":"unpaid"' curl -s $BASE/orders/$O ...`.
until_has() {
    local want="$1" out="" _
    shift
    for _ in $(seq 20); do
        out="$("$@")" || true
        case "$out" in *"$want"*) echo "$out"; return 0 ;; esac
        sleep 1
    done
    echo "$out"
    echo "until_has: no $want in 20 s: $*" >&2
    return 1
}
