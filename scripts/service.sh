# Sourced by scripts that need a running service of their own (fuzz.sh,
# oha.sh): `start_service` builds the binary (the release profile, or the
# one SERVICE_PROFILE names: CI gives `dev`, which its tests built
# already) and starts it on a
# free port against a database of its own, sets BASE (its URL) and ADMIN
# (its admin token), and stops it, drops the database and deletes its Redis
# keys on exit. The load tools drive it from one address, so its rate
# limits are off unless SECKILL_LIMIT_PER_ADDRESS / _PER_USER say otherwise.
# Needs deps.sh sourced first (DATABASE_URL, REDIS_URL).

start_service() {
    local run server port
    run="$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    server="${DATABASE_URL%/*}"
    SERVICE_DB="seckill_script_$run"
    SERVICE_PREFIX="script:$run:"
    SERVICE_SERVER="$server"
    port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
    ADMIN="script-admin-$run$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')"
    BASE="http://127.0.0.1:$port"
    SERVICE_LOG="target/service-$run.log"
    local profile="${SERVICE_PROFILE:-release}" dir
    dir="$profile"; [ "$profile" = dev ] && dir=debug
    cargo build --quiet --profile "$profile" --bin seckill
    DATABASE_URL="$server/$SERVICE_DB" SECKILL_ADDR="127.0.0.1:$port" SECKILL_ADMIN_TOKEN="$ADMIN" \
        SECKILL_REDIS_PREFIX="$SERVICE_PREFIX" RUST_LOG=warn \
        SECKILL_LIMIT_PER_ADDRESS="${SECKILL_LIMIT_PER_ADDRESS:-0}" \
        SECKILL_LIMIT_PER_USER="${SECKILL_LIMIT_PER_USER:-0}" \
        "${CARGO_TARGET_DIR:-target}/$dir/seckill" serve > "$SERVICE_LOG" 2>&1 &
    SERVICE_PID=$!
    trap stop_service EXIT
    for _ in $(seq 1 100); do
        curl -sf "$BASE/readyz" >/dev/null && return 0
        sleep 0.2
    done
    echo "the service did not start:" >&2
    cat "$SERVICE_LOG" >&2
    return 1
}

stop_service() {
    kill -TERM "$SERVICE_PID" 2>/dev/null || true
    wait "$SERVICE_PID" 2>/dev/null || true
    psql "$SERVICE_SERVER/postgres" -q -c "DROP DATABASE IF EXISTS \"$SERVICE_DB\" WITH (FORCE)" >/dev/null 2>&1 || true
    if command -v redis-cli >/dev/null; then
        redis-cli -u "$REDIS_URL" --scan --pattern "$SERVICE_PREFIX*" 2>/dev/null |
            xargs -r -n 500 redis-cli -u "$REDIS_URL" unlink >/dev/null 2>&1 || true
    fi
}
