#!/usr/bin/env bash
# Writes .env beside docker-compose.yml with a random admin token, user
# token key and payment secret (32 random bytes each, in hex), unless it
# holds them already: `docker compose` reads them from there, and the
# compose file has no defaults, so no two deployments share a secret and
# none is a placeholder from a file. Prints the admin token.
set -euo pipefail
cd "$(dirname "$0")/.."
env_file=.env
touch "$env_file"
chmod 600 "$env_file"
for name in SECKILL_ADMIN_TOKEN SECKILL_TOKEN_SECRET SECKILL_PAYMENT_SECRET; do
    if ! grep -q "^$name=." "$env_file"; then
        value="$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n')"
        echo "$name=$value" >> "$env_file"
        echo "wrote $name to $env_file" >&2
    fi
done
grep '^SECKILL_ADMIN_TOKEN=' "$env_file" | cut -d= -f2- | sed 's/^/admin token: /'
